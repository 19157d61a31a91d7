//! Agent hosts end to end with the REAL host agent: `switchyard-host enroll` and
//! `switchyard-host run` as child processes against an in-process pod (the public listener
//! for enrollment, the pod's own mTLS listener for the data plane), exec-adapter agents that
//! are small shell scripts in a temp dir, and an xAgent device channel on `/hosts` driving
//! the runs with the Card's tools. `hosts_gateway.rs` covers the same protocol with a raw
//! host client.
//!
//! Every scenario has its own pod, temp dir and host agent process; the host agent's stderr
//! goes to a file that is printed when the scenario fails.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use switchyard::config::Dur;
use switchyard_e2e::hosts::{bind_device_channel, enrollment_token, tool};
use switchyard_e2e::{Conn, Pod, PodOptions, Sim, switchyard_host_binary};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

/// Generous deadline for anything that should happen promptly (tests run in parallel on a
/// loaded machine).
const PROMPT: Duration = Duration::from_secs(20);

// ---- the host agent process ----------------------------------------------------------

/// A running `switchyard-host run`.
struct HostAgent {
    child: Child,
    pid: u32,
    label: String,
    stderr_path: PathBuf,
    stdout: mpsc::UnboundedReceiver<String>,
}

impl HostAgent {
    /// `switchyard-host run --server TLS_URL --state-dir DIR --config FILE --transport T
    /// --backoff-scale-ms 50`, stdout piped (the pairing line), stderr into `LABEL.stderr`.
    fn start(pod: &Pod, state_dir: &Path, config: &Path, transport: &str, label: &str) -> Self {
        let stderr_path = state_dir
            .parent()
            .expect("state dir parent")
            .join(format!("{label}.stderr"));
        let stderr = std::fs::File::create(&stderr_path).expect("stderr file");
        let mut child = Command::new(switchyard_host_binary())
            .arg("run")
            .args(["--server", &pod.hosts_tls_url()])
            .arg("--state-dir")
            .arg(state_dir)
            .arg("--config")
            .arg(config)
            .args(["--transport", transport, "--backoff-scale-ms", "50"])
            .env("RUST_LOG", "info,switchyard_host_agent=debug")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .kill_on_drop(true)
            .spawn()
            .expect("spawn switchyard-host run");
        let pid = child.id().expect("pid of switchyard-host");
        let out = child.stdout.take().expect("stdout pipe");
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut lines = BufReader::new(out).lines();
            while let Ok(Some(l)) = lines.next_line().await {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Self {
            child,
            pid,
            label: label.to_owned(),
            stderr_path,
            stdout: rx,
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// The code of the `pairing code: XXXX-XXXX` line (stdout carries nothing else).
    async fn pairing_code(&mut self) -> String {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        match tokio::time::timeout_at(deadline, self.stdout.recv()).await {
            Ok(Some(line)) => match line.strip_prefix("pairing code: ") {
                Some(code) => code.trim().to_owned(),
                None => panic!(
                    "stdout of `run` carries only the pairing line, got {line:?}; stderr:\n{}",
                    self.stderr()
                ),
            },
            Ok(None) => panic!(
                "{} exited before printing its pairing code ({:?}); stderr:\n{}",
                self.label,
                self.child.try_wait(),
                self.stderr()
            ),
            Err(_) => panic!(
                "{}: no pairing code within 30 s; stderr:\n{}",
                self.label,
                self.stderr()
            ),
        }
    }

    /// The exit status, if the process ends within `d`.
    async fn exit_within(&mut self, d: Duration) -> Option<ExitStatus> {
        tokio::time::timeout(d, self.child.wait())
            .await
            .ok()
            .map(|r| r.expect("wait for switchyard-host"))
    }

    /// SIGKILL: no chance to stop its runs or say goodbye.
    async fn kill9(&mut self) {
        self.child.start_kill().expect("SIGKILL switchyard-host");
        self.child.wait().await.expect("reap switchyard-host");
    }
}

impl Drop for HostAgent {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "---- {} (pid {}) stderr ----\n{}---- end ----",
                self.label,
                self.pid,
                self.stderr()
            );
        }
        if matches!(self.child.try_wait(), Ok(None)) {
            // SIGTERM first: the host agent stops its runs' process groups before it exits
            // (kill_on_drop's SIGKILL would leave them running).
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &self.pid.to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(6);
            while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

// ---- files ---------------------------------------------------------------------------

/// Writes an executable `#!/bin/sh` script.
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{}\n", body.trim())).expect("write script");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

/// A path as a TOML string.
fn q(p: &Path) -> String {
    let s = p.to_str().expect("utf-8 path");
    assert!(!s.contains(['"', '\\']), "plain temp path");
    format!("\"{s}\"")
}

/// Whether `pid` is a live (not zombie) process.
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next());
            !matches!(state, Some('Z' | 'X'))
        }
        Err(_) => false,
    }
}

/// The pids (first word of each line) a script appended to `file`.
fn pids_in(file: &Path) -> Vec<u32> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect()
}

async fn wait_gone(pid: u32, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while alive(pid) {
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    true
}

// ---- the scenario fixture ------------------------------------------------------------

/// A pod, an enrolled host with a running `switchyard-host`, and an xAgent device channel
/// bound to it with the pairing code the host printed.
struct Setup {
    // Dropped first: SIGTERM to the host agent while the pod and the temp dir still exist.
    agent: HostAgent,
    conn: Conn,
    ch: String,
    _sim: Sim,
    host_id: String,
    pairing: String,
    state_dir: PathBuf,
    config: PathBuf,
    dir: tempfile::TempDir,
    pod: Pod,
}

/// `switchyard-host enroll --server ROOT --token T --state-dir DIR`; returns the host id.
async fn enroll_cli(pod: &Pod, name: &str, state_dir: &Path) -> String {
    let token = enrollment_token(pod, &pod.tenant.id, name).await;
    let out = Command::new(switchyard_host_binary())
        .arg("enroll")
        .args(["--server", &pod.root_url(), "--token", &token])
        .arg("--state-dir")
        .arg(state_dir)
        .env("RUST_LOG", "debug")
        .output()
        .await
        .expect("run switchyard-host enroll");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "enroll failed ({}): {stdout}\n{stderr}",
        out.status
    );
    assert!(
        !stdout.contains(&token) && !stderr.contains(&token),
        "the enrollment token is never printed"
    );
    let host: Value = serde_json::from_str(
        &std::fs::read_to_string(state_dir.join("host.json")).expect("host.json"),
    )
    .expect("host.json is JSON");
    let host_id = host["host_id"].as_str().expect("host_id").to_owned();
    assert_eq!(host["name"], name);
    assert_eq!(host["tenant_id"], pod.tenant.id.as_str());
    assert!(
        stdout.contains(&format!(
            "enrolled host {host_id} ({name}) of tenant {}",
            pod.tenant.id
        )),
        "{stdout}"
    );
    host_id
}

impl Setup {
    /// `agents` writes the scripts it needs into the temp dir and returns the config TOML.
    async fn new(
        opts: PodOptions,
        name: &str,
        transport: &str,
        agents: impl FnOnce(&Path) -> String,
    ) -> Self {
        let pod = Pod::start(opts).await;
        let dir = tempfile::tempdir().expect("temp dir");
        let state_dir = dir.path().join("state");
        let host_id = enroll_cli(&pod, name, &state_dir).await;
        let config = dir.path().join("host.toml");
        std::fs::write(&config, agents(dir.path())).expect("write config");
        let mut agent = HostAgent::start(&pod, &state_dir, &config, transport, "host-agent");
        let pairing = agent.pairing_code().await;
        let (sim, conn, ch) = bind_device_channel(&pod, name, &pairing).await;
        // agent_run_wait calls below block up to 10 s.
        conn.set_request_timeout(Duration::from_secs(30));
        Self {
            agent,
            conn,
            ch,
            _sim: sim,
            host_id,
            pairing,
            state_dir,
            config,
            dir,
            pod,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A tool's `result`; panics with the error (and the host's stderr) otherwise.
    async fn call(&self, tool_id: &str, args: Value) -> Value {
        let v = tool(&self.conn, &self.ch, tool_id, args.clone()).await;
        match v.get("result") {
            Some(r) if !r.is_null() => r.clone(),
            _ => panic!(
                "{tool_id}({args}) failed: {v}\nhost agent stderr:\n{}",
                self.agent.stderr()
            ),
        }
    }

    async fn start_run(&self, args: Value) -> String {
        let r = self.call("agent_run_start", args).await;
        assert_eq!(r["state"], "queued", "{r}");
        r["run_id"].as_str().expect("run_id").to_owned()
    }

    /// The run as `agent_run_wait` shows it right now.
    async fn run_now(&self, run: &str) -> Value {
        self.call(
            "agent_run_wait",
            json!({"run_id": run, "timeout_seconds": 0}),
        )
        .await
    }

    /// Polls the run until `pred` holds.
    async fn run_until(
        &self,
        run: &str,
        what: &str,
        within: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let v = self.run_now(run).await;
            if pred(&v) {
                return v;
            }
            if Instant::now() >= deadline {
                panic!(
                    "{what}: not within {within:?}; run {v}\nhost agent stderr:\n{}",
                    self.agent.stderr()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Blocks in `agent_run_wait` (as a model would) until the run is done.
    async fn wait_done(&self, run: &str, within: Duration) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let v = self
                .call(
                    "agent_run_wait",
                    json!({"run_id": run, "timeout_seconds": 10}),
                )
                .await;
            if v["done"] == true {
                return v;
            }
            if Instant::now() >= deadline {
                panic!(
                    "run not done within {within:?}: {v}\nhost agent stderr:\n{}",
                    self.agent.stderr()
                );
            }
        }
    }

    /// The run's whole event log, paged through `agent_run_events`.
    async fn events(&self, run: &str) -> Vec<Value> {
        let mut all = Vec::new();
        let mut after = 0;
        loop {
            let page = self
                .call(
                    "agent_run_events",
                    json!({"run_id": run, "after_seq": after, "limit": 100}),
                )
                .await;
            all.extend(page["events"].as_array().cloned().unwrap_or_default());
            after = page["next_after_seq"].as_i64().unwrap_or(after);
            if page["more"] != true {
                return all;
            }
        }
    }

    /// Waits until the run's log has an event for which `pred` holds; returns the log.
    async fn events_until(
        &self,
        run: &str,
        what: &str,
        pred: impl Fn(&Value) -> bool,
    ) -> Vec<Value> {
        let deadline = Instant::now() + PROMPT;
        loop {
            let evs = self.events(run).await;
            if evs.iter().any(&pred) {
                return evs;
            }
            if Instant::now() >= deadline {
                panic!(
                    "no event {what} within {PROMPT:?}: {evs:#?}\nhost agent stderr:\n{}",
                    self.agent.stderr()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Reads the pod's store like the admin CLI does.
    async fn admin(&self) -> std::sync::Arc<switchyard_core::hosts::Hosts> {
        switchyard::app::admin_hosts(self.pod.config())
            .await
            .expect("admin hosts")
    }
}

fn kinds(events: &[Value]) -> Vec<&str> {
    events
        .iter()
        .map(|e| e["event"].as_str().unwrap_or("?"))
        .collect()
}

fn progress_messages(events: &[Value]) -> Vec<&str> {
    events
        .iter()
        .filter(|e| e["event"] == "progress")
        .filter_map(|e| e["payload"]["message"].as_str())
        .collect()
}

fn is_progress(e: &Value, message: &str) -> bool {
    e["event"] == "progress" && e["payload"]["message"] == message
}

// ---- scenarios -----------------------------------------------------------------------

/// 1. Enrollment with the CLI, then a run from xAgent through the real host agent: events
///    in order, the artifact the script wrote, live host status.
#[tokio::test]
async fn enrolled_host_agent_runs_an_exec_agent_end_to_end() {
    let t0 = Instant::now();
    let s = Setup::new(PodOptions::default(), "build-box", "wss", |dir| {
        let agent = script(
            dir,
            "build-agent.sh",
            r#"
read goal
echo "starting: $goal"
echo '{"event":"thinking","payload":{"text":"planning the build"}}'
echo '{"event":"tool_call","payload":{"tool":"terminal","command":"make all","output":"ok"}}'
printf 'report for %s\nrun %s\n' "$goal" "$SWITCHYARD_RUN_ID" > "$SWITCHYARD_RUN_ARTIFACTS/report.txt"
echo "argv: $*; goal env: $SWITCHYARD_RUN_GOAL"
echo "done: $goal"
"#,
        );
        format!(
            r#"
kill_grace_s = 1

[[agents]]
name = "builder"
runtime = "exec"
command = [{}, "--fast"]
model = "none"
tools = ["terminal"]
max_turns = 10
"#,
            q(&agent)
        )
    })
    .await;

    // The state dir the CLI filled.
    let key_mode = std::fs::metadata(s.state_dir.join("key.pem"))
        .expect("key.pem")
        .permissions()
        .mode();
    assert_eq!(key_mode & 0o777, 0o600, "the key is private");
    for f in ["cert.pem", "ca.pem", "host.json"] {
        assert!(s.state_dir.join(f).is_file(), "{f} in the state dir");
    }
    let ids: Value = serde_json::from_str(
        &std::fs::read_to_string(s.state_dir.join("agents.json")).expect("agents.json"),
    )
    .expect("agents.json is JSON");
    let agent_id = ids["name:builder"]
        .as_str()
        .expect("generated id kept by name")
        .to_owned();
    let p = s.pairing.as_bytes();
    assert!(
        p.len() == 9 && p[4] == b'-',
        "pairing code is XXXX-XXXX: {}",
        s.pairing
    );
    let rec = s
        .admin()
        .await
        .hub()
        .store()
        .get_host(&s.host_id)
        .await
        .expect("store")
        .expect("host record");
    assert_eq!(rec.name, "build-box");
    assert_eq!(rec.tenant_id, s.pod.tenant.id);

    // host_status: online with real metrics and the configured agent.
    let deadline = Instant::now() + PROMPT;
    let status = loop {
        let st = s.call("host_status", json!({})).await;
        if st["status"] == "online"
            && st["metrics"]["memory_mb"].as_u64().is_some_and(|m| m > 0)
            && st["agents"].as_array().is_some_and(|a| !a.is_empty())
        {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "host never online with metrics: {st}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(status["adapters"], json!(["exec"]), "{status}");
    assert!(status["hostname"].as_str().is_some_and(|h| !h.is_empty()));
    assert!(
        status["agent_version"]
            .as_str()
            .is_some_and(|v| !v.is_empty())
    );
    assert!(status["metrics"]["cpu_pct"].as_f64().is_some(), "{status}");
    let agents = status["agents"].as_array().expect("agents");
    assert_eq!(agents.len(), 1, "{status}");
    assert_eq!(agents[0]["agent_id"], agent_id.as_str());
    assert_eq!(agents[0]["runtime"], "exec");
    assert_eq!(agents[0]["model"], "none");
    assert_eq!(agents[0]["tools"], json!(["terminal"]));
    assert_eq!(agents[0]["max_turns"], 10);
    assert_eq!(agents[0]["supports"], json!(["streaming", "cancellation"]));

    // The run.
    let goal = "build the widget";
    let run = s
        .start_run(json!({"goal": goal, "constraints": {"timeout_seconds": 60}}))
        .await;
    let done = s.wait_done(&run, Duration::from_secs(45)).await;
    assert_eq!(done["state"], "completed", "{done}");
    assert_eq!(done["summary"], "done: build the widget", "last line");
    assert!(done["error"].is_null(), "{done}");
    assert_eq!(done["agent_id"], agent_id.as_str());
    let expected = format!("report for {goal}\nrun {run}\n");
    let arts = done["artifacts"]
        .as_array()
        .expect("artifacts of a done run");
    assert_eq!(arts.len(), 1, "{done}");
    assert_eq!(arts[0]["name"], "report.txt");
    assert_eq!(arts[0]["size_bytes"], expected.len());
    assert!(
        arts[0]["content_type"]
            .as_str()
            .is_some_and(|c| c.starts_with("text/plain")),
        "{done}"
    );
    let artifact_id = arts[0]["artifact_id"]
        .as_str()
        .expect("artifact id")
        .to_owned();

    // Events, in the order the script printed them, then the completion.
    let evs = s.events(&run).await;
    assert_eq!(
        kinds(&evs),
        [
            "progress",
            "thinking",
            "tool_call",
            "progress",
            "progress",
            "completion"
        ],
        "{evs:#?}"
    );
    let seqs: Vec<i64> = evs.iter().filter_map(|e| e["seq"].as_i64()).collect();
    assert_eq!(seqs, [1, 2, 3, 4, 5, 6]);
    assert_eq!(
        progress_messages(&evs),
        [
            "starting: build the widget",
            "argv: --fast; goal env: build the widget",
            "done: build the widget"
        ]
    );
    assert_eq!(evs[1]["payload"]["text"], "planning the build");
    assert_eq!(evs[2]["payload"]["tool"], "terminal");
    assert_eq!(evs[2]["payload"]["command"], "make all");
    assert_eq!(evs[2]["payload"]["output"], "ok");
    assert_eq!(evs[5]["payload"]["summary"], "done: build the widget");
    assert_eq!(evs[5]["payload"]["artifacts"], json!([artifact_id]));
    assert_eq!(done["event_count"], 6);

    // The artifact, fetched into the channel's files: the script's bytes.
    let fetched = s
        .call("agent_artifact_fetch", json!({"artifact_id": artifact_id}))
        .await;
    assert_eq!(fetched["filename"], "report.txt");
    assert_eq!(fetched["byte_size"], expected.len());
    let url = fetched["download_url"].as_str().expect("download_url");
    let resp = reqwest::get(url).await.expect("download");
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.bytes().await.expect("bytes").as_ref(),
        expected.as_bytes()
    );

    // The run dir stays on the host.
    let runs: Vec<PathBuf> = std::fs::read_dir(s.state_dir.join("runs"))
        .expect("runs dir")
        .map(|e| e.expect("entry").path())
        .collect();
    assert_eq!(runs.len(), 1);
    assert_eq!(
        std::fs::read_to_string(runs[0].join("artifacts").join("report.txt")).expect("kept"),
        expected
    );

    let after = s.call("host_status", json!({})).await;
    assert_eq!(after["active_runs"], json!([]), "{after}");
    eprintln!("scenario 1 took {:?}", t0.elapsed());
}

/// 2. A non-zero exit and a run over its time limit both end failed (adapter_error).
#[tokio::test]
async fn failing_and_timed_out_runs_end_failed() {
    let t0 = Instant::now();
    let s = Setup::new(PodOptions::default(), "fail-box", "wss", |dir| {
        let pidfile = dir.join("sleeper.pid");
        let failer = script(
            dir,
            "failer.sh",
            r#"
read goal
echo "about to fail: $goal"
echo "boom on stderr" >&2
exit 3
"#,
        );
        let sleeper = script(
            dir,
            "sleeper.sh",
            &format!(
                r#"
read goal
echo $$ > {}
echo "sleeping"
sleep 30
echo "woke up"
"#,
                q(&pidfile)
            ),
        );
        format!(
            r#"
kill_grace_s = 1

[[agents]]
agent_id = "failer"
runtime = "exec"
command = [{}]

[[agents]]
agent_id = "sleeper"
runtime = "exec"
command = [{}]
"#,
            q(&failer),
            q(&sleeper)
        )
    })
    .await;

    // Exit 3.
    let run = s
        .start_run(json!({"goal": "break things", "agent_id": "failer"}))
        .await;
    let done = s.wait_done(&run, Duration::from_secs(45)).await;
    assert_eq!(done["state"], "failed", "{done}");
    assert_eq!(done["error"]["code"], "adapter_error", "{done}");
    assert!(
        done["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("exited with status 3")),
        "{done}"
    );
    assert!(done["summary"].is_null(), "{done}");
    let evs = s.events(&run).await;
    assert!(
        evs.iter()
            .any(|e| is_progress(e, "about to fail: break things")),
        "{evs:#?}"
    );
    assert!(
        evs.iter()
            .any(|e| e["event"] == "warning" && e["payload"]["message"] == "stderr: boom on stderr"),
        "stderr lines become warnings: {evs:#?}"
    );
    let last = evs.last().expect("events");
    assert_eq!(last["event"], "error", "{evs:#?}");
    assert_eq!(last["payload"]["fatal"], true, "{last}");

    // timeout_seconds = 1 on a script that sleeps 30 s.
    let started = Instant::now();
    let run = s
        .start_run(
            json!({"goal": "nap", "agent_id": "sleeper", "constraints": {"timeout_seconds": 1}}),
        )
        .await;
    let done = s.wait_done(&run, Duration::from_secs(45)).await;
    let took = started.elapsed();
    assert_eq!(done["state"], "failed", "{done}");
    assert_eq!(done["error"]["code"], "adapter_error", "{done}");
    assert!(
        done["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("timed out after 1 s")),
        "{done}"
    );
    assert!(took >= Duration::from_secs(1), "{took:?}");
    assert!(
        took < Duration::from_secs(25),
        "long before the 30 s sleep ends: {took:?}"
    );
    let evs = s.events(&run).await;
    assert!(evs.iter().any(|e| is_progress(e, "sleeping")), "{evs:#?}");
    assert!(!evs.iter().any(|e| is_progress(e, "woke up")), "{evs:#?}");
    let pid = pids_in(&s.path("sleeper.pid"))[0];
    assert!(
        wait_gone(pid, Duration::from_secs(5)).await,
        "timed-out agent {pid} is gone"
    );
    eprintln!("scenario 2 took {:?}", t0.elapsed());
}

/// 3. Cancel of an agent that ignores SIGTERM: SIGKILL after kill_grace_s, then
///    `run_cancelled`; the process is gone.
#[tokio::test]
async fn cancel_escalates_to_sigkill_when_the_agent_ignores_sigterm() {
    let t0 = Instant::now();
    let grace = Duration::from_secs(2);
    let s = Setup::new(PodOptions::default(), "cancel-box", "wss", |dir| {
        let stubborn = script(
            dir,
            "stubborn.sh",
            &format!(
                r#"
trap 'echo "got TERM, ignoring it"' TERM
read goal
echo $$ > {}
echo "working on $goal"
i=0
while [ "$i" -lt 600 ]; do sleep 0.1; i=$((i+1)); done
echo "finished without being cancelled"
"#,
                q(&dir.join("stubborn.pid"))
            ),
        );
        format!(
            "kill_grace_s = {}\n\n[[agents]]\nname = \"stubborn\"\nruntime = \"exec\"\ncommand = [{}]\n",
            grace.as_secs(),
            q(&stubborn)
        )
    })
    .await;

    let run = s.start_run(json!({"goal": "the long job"})).await;
    s.events_until(&run, "working", |e| {
        is_progress(e, "working on the long job")
    })
    .await;
    let running = s.run_now(&run).await;
    assert_eq!(running["state"], "running", "{running}");
    let pid = pids_in(&s.path("stubborn.pid"))[0];
    assert!(alive(pid));

    let asked = Instant::now();
    let cancel = s.call("agent_run_cancel", json!({"run_id": run})).await;
    assert_eq!(cancel["cancel_requested"], true, "{cancel}");
    let done = s
        .run_until(&run, "cancelled", Duration::from_secs(30), |v| {
            v["done"] == true
        })
        .await;
    let took = asked.elapsed();
    assert_eq!(done["state"], "cancelled", "{done}");
    assert!(
        done["error"].is_null(),
        "confirmed by the host (not cancel_timeout): {done}"
    );
    // SIGTERM was ignored, so the run ended only at the SIGKILL after the grace period.
    assert!(took >= grace - Duration::from_millis(300), "{took:?}");
    assert!(
        took < Duration::from_secs(14),
        "well before cancel_confirm: {took:?}"
    );
    assert!(
        wait_gone(pid, Duration::from_secs(5)).await,
        "agent {pid} is gone"
    );
    let evs = s
        .events_until(&run, "the trap's line", |e| {
            is_progress(e, "got TERM, ignoring it")
        })
        .await;
    assert!(
        !evs.iter()
            .any(|e| is_progress(e, "finished without being cancelled")),
        "{evs:#?}"
    );
    assert!(!evs.iter().any(|e| e["event"] == "completion"), "{evs:#?}");
    eprintln!(
        "scenario 3 took {:?} (cancel -> cancelled {took:?})",
        t0.elapsed()
    );
}

/// 4. A risky action waits for a person: granted over the operator HTTP API, denied
///    through the CLI path; the agent reads the answer on stdin. A harmless one is
///    answered locally at once.
#[tokio::test]
async fn risky_actions_wait_for_a_person_and_the_answer_reaches_the_agent() {
    let t0 = Instant::now();
    let token = "8b1d3f5a7c9e0b2d4f6a8c1e3b5d7f9a0c2e4b6d8f1a3c5e7b9d0f2a4c6e8b1d";
    let opts = PodOptions::default().with(|c| {
        c.operator_tokens =
            serde_json::from_value(json!(format!("alice@example.com={token}"))).expect("tokens");
        c.hosts.tick = Dur(Duration::from_millis(200));
    });
    let s = Setup::new(opts, "risky-box", "wss", |dir| {
        let careful = script(
            dir,
            "careful.sh",
            r#"
read goal
echo "checking: $goal"
echo '{"approval": "ls /tmp", "risk_level": "low"}'
read local_answer
echo "local answer: $local_answer"
echo '{"approval": "rm -rf /tmp/x", "risk_level": "high"}'
read answer
echo "answer: $answer"
"#,
        );
        format!(
            "[[agents]]\nname = \"careful\"\nruntime = \"exec\"\ncommand = [{}]\nrisky = [\"rm -rf\", \"git push*\"]\n",
            q(&careful)
        )
    })
    .await;
    let http = reqwest::Client::new();
    let admin = format!("{}/admin/v1/approvals", s.pod.admin_url());
    let pending_of = |run: String| {
        let http = http.clone();
        let admin = admin.clone();
        let tenant = s.pod.tenant.id.clone();
        async move {
            let list: Value = http
                .get(&admin)
                .query(&[("tenant", tenant.as_str()), ("status", "pending")])
                .bearer_auth(token)
                .send()
                .await
                .expect("list approvals")
                .json()
                .await
                .expect("approvals JSON");
            list.as_array()
                .expect("array")
                .iter()
                .filter(|a| a["run_id"] == run.as_str())
                .cloned()
                .collect::<Vec<Value>>()
        }
    };

    // Granted over HTTP.
    let run = s.start_run(json!({"goal": "clean up"})).await;
    s.run_until(&run, "awaiting_approval", PROMPT, |v| {
        v["state"] == "awaiting_approval"
    })
    .await;
    let pending = pending_of(run.clone()).await;
    assert_eq!(
        pending.len(),
        1,
        "only the risky action asks a person: {pending:?}"
    );
    assert_eq!(pending[0]["action"], "rm -rf /tmp/x");
    assert_eq!(pending[0]["risk_level"], "high");
    assert_eq!(pending[0]["host_id"], s.host_id.as_str());
    let approval = pending[0]["approval_id"].as_str().expect("id").to_owned();
    let granted = http
        .post(format!("{admin}/{approval}/grant"))
        .bearer_auth(token)
        .send()
        .await
        .expect("grant");
    assert_eq!(granted.status(), 200);
    let granted: Value = granted.json().await.expect("grant JSON");
    assert_eq!(granted["status"], "granted");
    assert_eq!(granted["decided_by"], "alice@example.com");
    let done = s.wait_done(&run, Duration::from_secs(45)).await;
    assert_eq!(done["state"], "completed", "{done}");
    assert_eq!(
        done["summary"],
        format!("answer: approved {}", host_own_id(&approval, &s.host_id)),
        "{done}"
    );
    let evs = s.events(&run).await;
    assert!(
        evs.iter()
            .any(|e| is_progress(e, "local answer: approved local")),
        "a harmless action is approved locally: {evs:#?}"
    );
    assert!(kinds(&evs).contains(&"approval_granted"), "{evs:#?}");

    // Denied through the CLI path.
    let run = s.start_run(json!({"goal": "clean up again"})).await;
    s.run_until(&run, "awaiting_approval", PROMPT, |v| {
        v["state"] == "awaiting_approval"
    })
    .await;
    let pending = pending_of(run.clone()).await;
    assert_eq!(pending.len(), 1, "{pending:?}");
    let approval = pending[0]["approval_id"].as_str().expect("id").to_owned();
    let decided = s
        .admin()
        .await
        .decide(&approval, None, false, "bob", Some("not on a Friday"))
        .await
        .expect("deny");
    assert_eq!(decided.status.as_str(), "denied");
    let done = s.wait_done(&run, Duration::from_secs(45)).await;
    assert_eq!(
        done["state"], "completed",
        "the script goes on after a denial: {done}"
    );
    assert_eq!(
        done["summary"],
        format!("answer: denied {}", host_own_id(&approval, &s.host_id)),
        "{done}"
    );
    let evs = s.events(&run).await;
    assert!(kinds(&evs).contains(&"approval_denied"), "{evs:#?}");
    assert!(
        evs.iter().any(|e| e["event"] == "warning"
            && e["payload"]["message"]
                == "approval denied by bob for \"rm -rf /tmp/x\": not on a Friday"),
        "a denial also emits a warning: {evs:#?}"
    );
    eprintln!("scenario 4 took {:?}", t0.elapsed());
}

/// The pod settings of the lost-host scenario: heartbeats every second, lost after 4 s.
fn fast_loss() -> PodOptions {
    PodOptions::default().with(|c| {
        c.hosts.heartbeat_interval = Dur(Duration::from_secs(1));
        c.hosts.heartbeat_response = Dur(Duration::from_secs(3));
        c.hosts.host_lost_after = Dur(Duration::from_secs(4));
        c.hosts.tick = Dur(Duration::from_millis(200));
    })
}

/// The agent of the restart scenarios. Goal `fresh`: finishes at once. Otherwise each start
/// appends "PID RUN_ID" to `incarnations`, prints `incarnation N` and then waits quietly
/// (printing nothing, so an orphaned copy gets no SIGPIPE) until the file `stop` appears
/// or 60 s pass; a second start of the same run would print `started again` and finish.
fn restart_agent(dir: &Path) -> String {
    let file = q(&dir.join("incarnations"));
    let stop = q(&dir.join("stop"));
    let agent = script(
        dir,
        "restartable.sh",
        &format!(
            r#"
read goal
if [ "$goal" = "fresh" ]; then echo "fresh run done"; exit 0; fi
echo "$$ $SWITCHYARD_RUN_ID" >> {file}
n=$(wc -l < {file})
echo "incarnation $n"
if [ "$n" -ge 2 ]; then
  echo "started again"
  exit 0
fi
i=0
while [ "$i" -lt 600 ] && [ ! -e {stop} ]; do sleep 0.1; i=$((i+1)); done
"#
        ),
    );
    format!(
        "kill_grace_s = 1\n\n[[agents]]\nname = \"restartable\"\nruntime = \"exec\"\ncommand = [{}]\n",
        q(&agent)
    )
}

/// Ends a process the test left behind (an agent orphaned by a SIGKILLed host agent).
struct Reaper(u32);

impl Drop for Reaper {
    fn drop(&mut self) {
        if alive(self.0) {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &self.0.to_string()])
                .status();
        }
    }
}

/// Starts a run, SIGKILLs `switchyard-host` while the agent runs, waits for the lost
/// policy to requeue the run, starts `switchyard-host run` again on the same state dir.
/// Returns the run id and (a reaper of) the first agent process.
async fn run_kill_and_restart(s: &mut Setup) -> (String, Reaper) {
    let run = s.start_run(json!({"goal": "survive a restart"})).await;
    s.run_until(&run, "running", PROMPT, |v| {
        v["state"] == "running" && v["event_count"] == 1
    })
    .await;
    let first = pids_in(&s.path("incarnations"));
    assert_eq!(first.len(), 1, "started once so far");
    let orphan = Reaper(first[0]);
    s.agent.kill9().await;

    let hosts = s.admin().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let h = hosts
            .hub()
            .store()
            .get_host(&s.host_id)
            .await
            .expect("store")
            .expect("host");
        let r = hosts
            .hub()
            .store()
            .get_run(&run)
            .await
            .expect("store")
            .expect("run");
        if h.status.as_str() == "lost" && r.state.as_str() == "queued" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "host {} / run {} never lost / requeued",
            h.status.as_str(),
            r.state.as_str()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The channel went offline before the run moved: its tools are refused.
    let refused = s
        .conn
        .invoke(&s.ch, "host_status", json!({}), None)
        .await
        .expect("tool.invoke");
    assert!(
        refused.error.is_some(),
        "tools are unavailable while the host is lost"
    );

    s.agent = HostAgent::start(
        &s.pod,
        &s.state_dir,
        &s.config,
        "wss",
        "host-agent-restarted",
    );
    let code = s.agent.pairing_code().await;
    assert_eq!(code, s.pairing, "the pairing code survives the restart");
    (run, orphan)
}

/// 5. `switchyard-host` SIGKILLed mid-run: the host is lost and the run requeued; a new
///    `switchyard-host run` on the same state dir gets the same run_id again, but (run state
///    lives in memory; `runs/<run_id>/` tells it an earlier process had the run) does not
///    start it twice: it answers with a fatal error without `seq` and the run ends failed,
///    once, in the server's view. The restarted host agent then runs new work normally.
#[tokio::test]
async fn killed_host_agent_restarts_and_the_interrupted_run_ends_once() {
    let t0 = Instant::now();
    let mut s = Setup::new(fast_loss(), "restart-box", "wss", restart_agent).await;
    let (run, orphan) = run_kill_and_restart(&mut s).await;

    let done = s.wait_done(&run, Duration::from_secs(45)).await;
    assert_eq!(done["state"], "failed", "{done}");
    assert_eq!(done["error"]["code"], "adapter_error", "{done}");
    assert!(
        done["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("restarted while this run was running")),
        "{done}"
    );
    let stderr = s.agent.stderr();
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("create_run") && l.contains(&run)),
        "re-dispatched to the new process with the same run_id:\n{stderr}"
    );
    assert_eq!(
        pids_in(&s.path("incarnations")).len(),
        1,
        "never started twice on the host"
    );
    let evs = s.events(&run).await;
    assert_eq!(
        kinds(&evs),
        ["progress", "error"],
        "the first incarnation's line, then one terminal event: {evs:#?}"
    );
    assert_eq!(evs[0]["payload"]["message"], "incarnation 1");
    assert_eq!(evs[1]["payload"]["fatal"], true);

    // The host is back: new work runs.
    let st = s.call("host_status", json!({})).await;
    assert_eq!(st["status"], "online", "{st}");
    let fresh = s.start_run(json!({"goal": "fresh"})).await;
    let done = s.wait_done(&fresh, Duration::from_secs(45)).await;
    assert_eq!(done["state"], "completed", "{done}");
    assert_eq!(done["summary"], "fresh run done");

    // The first agent process, in its own process group, outlived the SIGKILLed host agent;
    // the restarted one stops it (scenario 5b).
    eprintln!(
        "scenario 5: first agent process {} alive after the run failed: {}",
        orphan.0,
        alive(orphan.0)
    );
    std::fs::write(s.path("stop"), b"").expect("stop file");
    assert!(wait_gone(orphan.0, Duration::from_secs(10)).await);
    eprintln!("scenario 5 took {:?}", t0.elapsed());
}

/// 5b. A SIGKILL of `switchyard-host` orphans the exec agent (its own process group); the
///     restarted host agent fails the run and stops the leftover process group.
#[tokio::test]
async fn killed_host_agent_leaves_no_agent_process_behind() {
    let mut s = Setup::new(fast_loss(), "orphan-box", "wss", restart_agent).await;
    let (run, orphan) = run_kill_and_restart(&mut s).await;
    let done = s.wait_done(&run, Duration::from_secs(45)).await;
    assert_eq!(done["state"], "failed", "{done}");
    assert!(
        wait_gone(orphan.0, Duration::from_secs(10)).await,
        "the interrupted run's agent process {} still runs after its run failed",
        orphan.0
    );
}

/// 6. The same end to end over the HTTPS fallback (`--transport https`).
#[tokio::test]
async fn https_fallback_transport_runs_end_to_end() {
    let t0 = Instant::now();
    let s = Setup::new(PodOptions::default(), "fallback-box", "https", |dir| {
        let agent = script(
            dir,
            "fallback-agent.sh",
            r#"
read goal
echo '{"event":"tool_call","payload":{"tool":"terminal","command":"uname","output":"Linux"}}'
echo "fallback says $goal" > "$SWITCHYARD_RUN_ARTIFACTS/out.txt"
echo "done over https: $goal"
"#,
        );
        format!(
            "[[agents]]\nname = \"fb\"\nruntime = \"exec\"\ncommand = [{}]\n",
            q(&agent)
        )
    })
    .await;
    let deadline = Instant::now() + PROMPT;
    loop {
        let st = s.call("host_status", json!({})).await;
        if st["status"] == "online" && st["metrics"]["memory_mb"].as_u64().is_some_and(|m| m > 0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "fallback host never online: {st}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let run = s.start_run(json!({"goal": "hello"})).await;
    let done = s.wait_done(&run, Duration::from_secs(45)).await;
    assert_eq!(done["state"], "completed", "{done}");
    assert_eq!(done["summary"], "done over https: hello");
    let evs = s.events(&run).await;
    assert_eq!(
        kinds(&evs),
        ["tool_call", "progress", "completion"],
        "{evs:#?}"
    );
    let art = done["artifacts"][0]["artifact_id"]
        .as_str()
        .expect("artifact")
        .to_owned();
    let fetched = s
        .call("agent_artifact_fetch", json!({"artifact_id": art}))
        .await;
    let url = fetched["download_url"].as_str().expect("download_url");
    let bytes = reqwest::get(url)
        .await
        .expect("get")
        .bytes()
        .await
        .expect("bytes");
    assert_eq!(bytes.as_ref(), b"fallback says hello\n");
    assert!(
        s.agent.stderr().contains("Https"),
        "the host agent says it uses the fallback"
    );

    eprintln!("scenario 6 took {:?}", t0.elapsed());
}

/// Revocation through the CLI path (`switchyard host revoke`, another process) while a
/// run is running: `switchyard-host` must exit within `within` with an error naming the
/// revocation, having stopped its agent; the run fails on the server; a new `run` with the
/// revoked identity gives up at once. Returns how long the exit took.
async fn revocation(name: &str, transport: &str, within: Duration) -> Duration {
    let mut s = Setup::new(
        PodOptions::default().with(|c| c.hosts.tick = Dur(Duration::from_millis(200))),
        name,
        transport,
        |dir| {
            let agent = script(
                dir,
                "forever.sh",
                &format!(
                    r#"
read goal
echo $$ > {}
echo "running forever"
i=0
while [ "$i" -lt 900 ]; do sleep 0.1; i=$((i+1)); done
"#,
                    q(&dir.join("forever.pid"))
                ),
            );
            format!(
                "kill_grace_s = 1\n\n[[agents]]\nname = \"forever\"\nruntime = \"exec\"\ncommand = [{}]\n",
                q(&agent)
            )
        },
    )
    .await;
    let run = s.start_run(json!({"goal": "never ends"})).await;
    s.events_until(&run, "running forever", |e| {
        is_progress(e, "running forever")
    })
    .await;
    let pid = pids_in(&s.path("forever.pid"))[0];

    let hosts = s.admin().await;
    let revoked_at = Instant::now();
    hosts.revoke(&s.host_id).await.expect("revoke");
    let status = s.agent.exit_within(within).await;
    let took = revoked_at.elapsed();
    let stderr = s.agent.stderr();
    let status = status.unwrap_or_else(|| {
        panic!("{transport}: switchyard-host still runs {within:?} after the revocation:\n{stderr}")
    });
    assert!(
        !status.success(),
        "a revoked host exits with an error: {status}"
    );
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error:") && last.contains("host_revoked"),
        "the last line names the revocation: {last:?}\n{stderr}"
    );
    eprintln!("{transport}: switchyard-host {status} {took:?} after revoke: {last}");
    if transport == "wss" {
        assert!(
            stderr.contains("4401"),
            "the live socket was closed with 4401:\n{stderr}"
        );
    }
    assert!(
        wait_gone(pid, Duration::from_secs(10)).await,
        "its agent {pid} was stopped"
    );
    let r = hosts
        .hub()
        .store()
        .get_run(&run)
        .await
        .expect("store")
        .expect("run");
    assert_eq!(r.state.as_str(), "failed");
    assert_eq!(r.error_code.as_deref(), Some("host_revoked"));
    // The revoked identity cannot come back: a new `run` gives up at once.
    s.agent = HostAgent::start(
        &s.pod,
        &s.state_dir,
        &s.config,
        transport,
        "host-agent-again",
    );
    let again = s.agent.exit_within(Duration::from_secs(30)).await;
    assert!(
        again.is_some_and(|st| !st.success()),
        "{}",
        s.agent.stderr()
    );
    assert!(
        s.agent.stderr().contains("host_revoked"),
        "{}",
        s.agent.stderr()
    );
    took
}

/// 7. Revocation of a host agent on the WebSocket: its socket is closed (4401), the
///    reconnect is refused, and the process exits naming the revocation.
#[tokio::test]
async fn revoked_host_agent_exits_with_a_clear_message() {
    let t0 = Instant::now();
    revocation("doomed-box", "wss", Duration::from_secs(30)).await;
    eprintln!("scenario 7 took {:?}", t0.elapsed());
}

/// 7b. The same on the HTTPS fallback: a CLI revocation (another process, so no doorbell on
///     the pod's bus) ends the open long poll at the pod's next tick.
#[tokio::test]
async fn revoked_fallback_host_agent_exits_with_a_clear_message() {
    let t0 = Instant::now();
    revocation("doomed-fallback-box", "https", Duration::from_secs(10)).await;
    eprintln!("scenario 7b took {:?}", t0.elapsed());
}

/// 7c. The fallback host agent should stop as promptly as the WebSocket one (7 takes well
///     under a second).
#[tokio::test]
async fn revoked_fallback_host_agent_exits_promptly() {
    let took = revocation("prompt-fallback-box", "https", Duration::from_secs(10)).await;
    assert!(took < Duration::from_secs(10), "{took:?}");
}

/// Operators see a host's approval ids scoped as `{host_id}:{id}`; the host knows its own id.
fn host_own_id<'a>(operator_id: &'a str, host_id: &str) -> &'a str {
    operator_id
        .strip_prefix(host_id)
        .and_then(|rest| rest.strip_prefix(':'))
        .expect("a host-chosen approval id is scoped to its host")
}
