//! Multi-pod harness: real `switchyard serve` processes sharing one Postgres schema, one NATS
//! subject prefix, one Redis key prefix and one S3 bucket, all fresh per [`Cluster`]; a fake
//! chat system on the target side; signed inbound posts; and a reconnecting xAgent client
//! ([`Agent`]) built on the simulator.
//!
//! Every test builds its own cluster (own schema, prefixes, bucket, ports), so the scenarios
//! run in parallel. Pod logs go to `target/tmp/cluster-logs/<cluster>/<pod>.log`; they are
//! kept (and their path printed) when a test fails.
//!
//! Knobs: `SWITCHYARD_E2E_BIN` runs another `switchyard` binary (e.g. a release build for
//! throughput figures); `SWITCHYARD_E2E_KEEP_LOGS=1` keeps the logs of passing tests too;
//! `SWITCHYARD_E2E_POD_LOG` is the pods' log filter (default `info`).

// Each scenario file uses part of this module.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use switchyard_core::ids::random_secret;
use switchyard_fake_webhook::{FakeWebhook, InboundRequest};
use switchyard_store_postgres::PostgresStore;
use switchyard_xagent_sim::{AckStatus, Conn, Deliveries, Envelope, EnvelopeExt, Sim, SimError};
use tokio::process::{Child, Command};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

pub const CARD_ID: &str = "im.webhook";
pub const IM_V2: &str = "xagent.im.v2";
pub const FLOW_BINDING: &str = "webhook_binding";
pub const TOOL_SEND: &str = "webhook_message_send";

/// How long a test waits for something that should happen promptly.
pub const WAIT: Duration = Duration::from_secs(20);

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_owned())
}

pub fn postgres_url() -> String {
    env_or(
        "SWITCHYARD_TEST_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    )
}

pub fn redis_url() -> String {
    env_or("SWITCHYARD_TEST_REDIS_URL", "redis://127.0.0.1:6379")
}

pub fn nats_url() -> String {
    env_or("SWITCHYARD_TEST_NATS_URL", "nats://127.0.0.1:4222")
}

/// The S3 endpoint and credentials of `scripts/start-s3.sh` unless the environment says
/// otherwise.
struct S3Env {
    endpoint: String,
    access_key: String,
    secret_key: String,
    region: String,
}

fn s3_env() -> S3Env {
    S3Env {
        endpoint: env_or("SWITCHYARD_TEST_S3_ENDPOINT", "http://127.0.0.1:9100"),
        access_key: env_or("AWS_ACCESS_KEY_ID", "switchyard-test"),
        secret_key: env_or("AWS_SECRET_ACCESS_KEY", "switchyard-test-secret"),
        region: env_or("AWS_REGION", "us-east-1"),
    }
}

fn s3_client(s3: &S3Env) -> aws_sdk_s3::Client {
    use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
    use aws_smithy_http_client::tls;
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https();
    let conf = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(s3.region.clone()))
        .credentials_provider(Credentials::new(
            &s3.access_key,
            &s3.secret_key,
            None,
            None,
            "switchyard-e2e",
        ))
        .http_client(http)
        .endpoint_url(&s3.endpoint)
        .force_path_style(true)
        .build();
    aws_sdk_s3::Client::from_conf(conf)
}

pub mod failover;

// ---- small helpers ---------------------------------------------------------------------

/// Polls `f` every 20 ms until it yields `Some`, or panics after `timeout`.
pub use switchyard_core::testkit::eventually;

/// A free local port (bound, then released) for a child process to listen on.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

fn port_open(port: u16) -> bool {
    std::net::TcpStream::connect_timeout(
        &SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(200),
    )
    .is_ok()
}

/// Path of the `switchyard` binary: `$CARGO_TARGET_DIR/debug`, else the test executable's
/// `../../`; built with `cargo build -p switchyard` when missing. (Not rebuilt when present:
/// a nested cargo would wait for the lock of the `cargo test` that runs us, and build with
/// other features than the workspace build; `scripts/test.sh` builds the whole workspace.)
pub fn switchyard_binary() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(bin) = std::env::var_os("SWITCHYARD_E2E_BIN") {
            return PathBuf::from(bin);
        }
        let debug_dir = match std::env::var_os("CARGO_TARGET_DIR") {
            Some(dir) => PathBuf::from(dir).join("debug"),
            // target/debug/deps/<test exe> -> target/debug
            None => std::env::current_exe()
                .expect("current exe")
                .parent()
                .and_then(|deps| deps.parent())
                .expect("target/debug")
                .to_path_buf(),
        };
        let bin = debug_dir.join(format!("switchyard{}", std::env::consts::EXE_SUFFIX));
        if !bin.exists() {
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join("Cargo.toml");
            let status = std::process::Command::new(cargo)
                .args([
                    "build",
                    "-p",
                    "switchyard",
                    "--bin",
                    "switchyard",
                    "--manifest-path",
                ])
                .arg(&manifest)
                .env("CARGO_TARGET_DIR", debug_dir.parent().expect("target dir"))
                .status()
                .expect("run cargo build");
            assert!(status.success(), "cargo build -p switchyard failed");
        }
        assert!(bin.exists(), "{} missing after build", bin.display());
        bin
    })
    .clone()
}

fn logs_root() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cluster-logs")
}

fn tail(path: &std::path::Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

// ---- the cluster -----------------------------------------------------------------------

/// Settings that differ between scenarios.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    pub nats_url: String,
    pub redis_url: String,
    /// Safety sweep of pending messages (doorbells are the fast path).
    pub sweep_interval: &'static str,
    pub ack_timeout: &'static str,
    pub drain_timeout: &'static str,
    /// Extra `SWITCHYARD_*` variables for every pod.
    pub extra_env: Vec<(String, String)>,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        Self {
            nats_url: nats_url(),
            redis_url: redis_url(),
            sweep_interval: "2s",
            ack_timeout: "2s",
            drain_timeout: "5s",
            extra_env: Vec::new(),
        }
    }
}

/// Where a pod listens.
#[derive(Debug, Clone)]
pub struct PodInfo {
    pub name: String,
    pub addr: SocketAddr,
    pub metrics: SocketAddr,
    /// The hosts mTLS listener.
    pub hosts_tls: SocketAddr,
    pub log: PathBuf,
    /// Start order within the cluster.
    pub seq: u64,
}

impl PodInfo {
    /// The `im.webhook` Connector Base URL.
    pub fn base_url(&self) -> String {
        format!("http://{}/webhook", self.addr)
    }
    pub fn metrics_url(&self) -> String {
        format!("http://{}", self.metrics)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodState {
    Running,
    /// SIGTERM sent.
    Draining,
    Exited,
    Killed,
}

struct Slot {
    info: PodInfo,
    state: PodState,
    child: Option<Child>,
}

/// A tenant created with `switchyard tenant create NAME --json`.
#[derive(Debug, Clone)]
pub struct Tenant {
    pub id: String,
    pub api_key: String,
}

pub struct Cluster {
    pub id: String,
    pub schema: String,
    pub nats_prefix: String,
    pub redis_prefix: String,
    pub bucket: String,
    opts: ClusterOptions,
    pg_url: String,
    signing_key: String,
    encryption_key: String,
    log_dir: PathBuf,
    data_dir: tempfile::TempDir,
    slots: Mutex<Vec<Slot>>,
    next_seq: AtomicU64,
    http: reqwest::Client,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Cluster {
    /// A fresh schema (migrated with `switchyard migrate`), NATS prefix, Redis prefix and
    /// bucket; no pod runs yet.
    pub async fn start(opts: ClusterOptions) -> Arc<Self> {
        let id = random_secret(5);
        let s3 = s3_env();
        let bucket = format!("cluster-{id}");
        s3_client(&s3)
            .create_bucket()
            .bucket(&bucket)
            .send()
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "creating bucket {bucket} at {} (is scripts/start-s3.sh running?): {e:?}",
                    s3.endpoint
                )
            });
        let log_dir = logs_root().join(format!("cl_{id}"));
        std::fs::create_dir_all(&log_dir).expect("log dir");
        eprintln!("cluster {id}: pod logs in {}", log_dir.display());
        let signing_key = random_secret(32);
        let encryption_key = switchyard_core::crypto::Cipher::generate_key();
        let cluster = Arc::new(Self {
            schema: format!("cl_{id}"),
            nats_prefix: format!("sy_e2e_{id}"),
            redis_prefix: format!("sy_e2e_{id}"),
            bucket,
            id,
            opts,
            pg_url: postgres_url(),
            signing_key,
            encryption_key,
            log_dir,
            data_dir: tempfile::tempdir().expect("data dir"),
            slots: Mutex::new(Vec::new()),
            next_seq: AtomicU64::new(0),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(20))
                .build()
                .expect("http client"),
        });
        let out = cluster.cli(&["migrate"]).await;
        assert!(out.contains("schema at version"), "migrate printed {out:?}");
        cluster
    }

    /// The environment every `switchyard` command of this cluster runs with.
    fn env(&self, cmd: &mut Command) {
        let s3 = s3_env();
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOSTNAME", "e2e")
            .env("NO_COLOR", "1")
            .env(
                "SWITCHYARD_LOG__LEVEL",
                env_or("SWITCHYARD_E2E_POD_LOG", "info"),
            )
            .env("SWITCHYARD_DATA_DIR", self.data_dir.path())
            // The fake chat systems listen on loopback.
            .env("SWITCHYARD_OUTBOUND__ALLOW_PRIVATE", "127.0.0.0/8,::1/128")
            .env("SWITCHYARD_DATABASE_URL", &self.pg_url)
            .env("SWITCHYARD_DATABASE_SCHEMA", &self.schema)
            .env("SWITCHYARD_DATABASE_MAX_CONNECTIONS", "5")
            .env("SWITCHYARD_NATS_URL", &self.opts.nats_url)
            .env("SWITCHYARD_NATS_SUBJECT_PREFIX", &self.nats_prefix)
            .env("SWITCHYARD_REDIS_URL", &self.opts.redis_url)
            .env("SWITCHYARD_REDIS_KEY_PREFIX", &self.redis_prefix)
            .env("SWITCHYARD_S3__ENDPOINT", &s3.endpoint)
            .env("SWITCHYARD_S3__BUCKET", &self.bucket)
            .env("SWITCHYARD_S3__REGION", &s3.region)
            .env("SWITCHYARD_S3__FORCE_PATH_STYLE", "true")
            .env("AWS_ACCESS_KEY_ID", &s3.access_key)
            .env("AWS_SECRET_ACCESS_KEY", &s3.secret_key)
            .env("AWS_REGION", &s3.region)
            .env("SWITCHYARD_SIGNING_KEYS", &self.signing_key)
            .env("SWITCHYARD_ENCRYPTION_KEYS", &self.encryption_key)
            .env("SWITCHYARD_LEASE__PRESENCE_TTL", "2s")
            .env("SWITCHYARD_LEASE__PRESENCE_INTERVAL", "500ms")
            .env("SWITCHYARD_LEASE__JANITOR_INTERVAL", "500ms")
            .env("SWITCHYARD_LEASE__JANITOR_LEASE_TTL", "3s")
            .env("SWITCHYARD_DELIVERY__ACK_TIMEOUT", self.opts.ack_timeout)
            .env(
                "SWITCHYARD_DELIVERY__SWEEP_INTERVAL",
                self.opts.sweep_interval,
            )
            .env("SWITCHYARD_DRAIN_TIMEOUT", self.opts.drain_timeout);
        for (k, v) in &self.opts.extra_env {
            cmd.env(k, v);
        }
    }

    /// Runs an administrative command to completion; returns its stdout.
    pub async fn cli(&self, args: &[&str]) -> String {
        let mut cmd = Command::new(switchyard_binary());
        cmd.args(args);
        self.env(&mut cmd);
        let out = cmd.output().await.expect("run switchyard");
        assert!(
            out.status.success(),
            "switchyard {args:?} failed: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub async fn tenant(&self, name: &str) -> Tenant {
        let out = self.cli(&["tenant", "create", name, "--json"]).await;
        let line = out
            .lines()
            .rev()
            .find(|l| l.trim_start().starts_with('{'))
            .expect("json line");
        let v: Value = serde_json::from_str(line).expect("tenant json");
        Tenant {
            id: v["tenant_id"].as_str().expect("tenant_id").to_owned(),
            api_key: v["api_key"].as_str().expect("api_key").to_owned(),
        }
    }

    /// Spawns `switchyard serve` as pod `name` on free ports and waits for `/readyz`.
    pub async fn start_pod(&self, name: &str) -> PodInfo {
        let mut last_log = String::new();
        for _attempt in 0..3 {
            let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
            let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()));
            let hosts_tls = SocketAddr::from(([127, 0, 0, 1], free_port()));
            let log = self.log_dir.join(format!("{name}.log"));
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .expect("pod log");
            let mut cmd = Command::new(switchyard_binary());
            cmd.arg("serve");
            self.env(&mut cmd);
            cmd.env("SWITCHYARD_POD_ID", name)
                .env("SWITCHYARD_LISTEN", addr.to_string())
                .env("SWITCHYARD_METRICS_LISTEN", metrics.to_string())
                .env("SWITCHYARD_HOSTS_TLS_LISTEN", hosts_tls.to_string())
                .env("SWITCHYARD_PUBLIC_BASE_URL", format!("http://{addr}"))
                .stdin(Stdio::null())
                .stdout(Stdio::from(file.try_clone().expect("log fd")))
                .stderr(Stdio::from(file))
                .kill_on_drop(true);
            let child = cmd.spawn().expect("spawn switchyard serve");
            let seq = self.next_seq.fetch_add(1, Ordering::SeqCst);
            let info = PodInfo {
                name: name.to_owned(),
                addr,
                metrics,
                hosts_tls,
                log: log.clone(),
                seq,
            };
            lock(&self.slots).push(Slot {
                info: info.clone(),
                state: PodState::Running,
                child: Some(child),
            });
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if self.readyz(&info).await == Some(200) {
                    return info;
                }
                if let Some(status) = self.try_exit(name) {
                    last_log = tail(&log, 20);
                    eprintln!(
                        "pod {name} exited during start ({status}); retrying on other ports:\n{last_log}"
                    );
                    lock(&self.slots).retain(|s| !(s.info.name == name && s.info.seq == seq));
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "pod {name} not ready within 30s:\n{}",
                    tail(&log, 30)
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        panic!("pod {name} failed to start:\n{last_log}");
    }

    /// Exit status of a pod whose process ended (marks it exited).
    fn try_exit(&self, name: &str) -> Option<std::process::ExitStatus> {
        let mut slots = lock(&self.slots);
        let slot = slots.iter_mut().rev().find(|s| s.info.name == name)?;
        let status = slot.child.as_mut()?.try_wait().ok()??;
        if slot.state != PodState::Killed {
            slot.state = PodState::Exited;
        }
        Some(status)
    }

    pub fn pod(&self, name: &str) -> PodInfo {
        lock(&self.slots)
            .iter()
            .rev()
            .find(|s| s.info.name == name)
            .map(|s| s.info.clone())
            .unwrap_or_else(|| panic!("no pod {name}"))
    }

    pub fn state(&self, name: &str) -> PodState {
        lock(&self.slots)
            .iter()
            .rev()
            .find(|s| s.info.name == name)
            .map(|s| s.state)
            .unwrap_or(PodState::Exited)
    }

    /// Pods not told to stop, in start order.
    pub fn live_pods(&self) -> Vec<PodInfo> {
        let mut v: Vec<PodInfo> = lock(&self.slots)
            .iter()
            .filter(|s| s.state == PodState::Running)
            .map(|s| s.info.clone())
            .collect();
        v.sort_by_key(|p| p.seq);
        v
    }

    /// Sends SIGTERM (the drain); the pod stops being a reconnect target at once.
    pub fn sigterm(&self, name: &str) {
        let mut slots = lock(&self.slots);
        let slot = slots
            .iter_mut()
            .rev()
            .find(|s| s.info.name == name)
            .expect("pod");
        let pid = slot
            .child
            .as_ref()
            .and_then(Child::id)
            .expect("pod process");
        let ok = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "kill -TERM {pid}");
        slot.state = PodState::Draining;
    }

    /// Waits for a pod's process to end; returns its exit status.
    pub async fn wait_exit(&self, name: &str, timeout: Duration) -> std::process::ExitStatus {
        let info = self.pod(name);
        eventually(timeout, &format!("pod {name} to exit"), || async {
            self.try_exit(name)
        })
        .await;
        let status = self.try_exit(name).expect("exited");
        eprintln!("pod {} exited: {status}", info.name);
        status
    }

    /// SIGKILL: no drain, no goodbye, no lease release.
    pub async fn sigkill(&self, name: &str) {
        let child = {
            let mut slots = lock(&self.slots);
            let slot = slots
                .iter_mut()
                .rev()
                .find(|s| s.info.name == name)
                .expect("pod");
            slot.state = PodState::Killed;
            slot.child.take()
        };
        if let Some(mut c) = child {
            c.kill().await.expect("SIGKILL pod");
        }
    }

    /// A store on the cluster's schema, for assertions on durable state.
    pub async fn store(&self) -> PostgresStore {
        PostgresStore::connect(&self.pg_url, Some(&self.schema), 2)
            .await
            .expect("connect postgres")
    }

    pub async fn probe(&self, pod: &PodInfo, path: &str) -> Option<u16> {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .ok()?;
        client
            .get(format!("{}{path}", pod.metrics_url()))
            .send()
            .await
            .ok()
            .map(|r| r.status().as_u16())
    }

    /// Sum of the Prometheus samples of `name` whose labels contain `label` (e.g.
    /// `outcome="retry"`) on a pod's `/metrics`; 0 when absent.
    pub async fn metric(&self, pod: &PodInfo, name: &str, label: &str) -> f64 {
        let Ok(resp) = self
            .http
            .get(format!("{}/metrics", pod.metrics_url()))
            .send()
            .await
        else {
            return 0.0;
        };
        let text = resp.text().await.unwrap_or_default();
        text.lines()
            .filter(|l| {
                l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']) && l.contains(label)
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .fold(0.0, |a, b| a + b)
    }

    pub async fn readyz(&self, pod: &PodInfo) -> Option<u16> {
        self.probe(pod, "/readyz").await
    }

    pub async fn livez(&self, pod: &PodInfo) -> Option<u16> {
        self.probe(pod, "/livez").await
    }

    /// A signed `im.webhook` inbound post; the status, or the transport error.
    pub async fn inbound(
        &self,
        pod: &PodInfo,
        channel: &str,
        secret: &str,
        message_id: &str,
        text: &str,
    ) -> Result<u16, reqwest::Error> {
        self.inbound_with(pod, channel, secret, message_id, text, &[])
            .await
    }

    /// [`Cluster::inbound`] with extra request headers (a `traceparent`).
    pub async fn inbound_with(
        &self,
        pod: &PodInfo,
        channel: &str,
        secret: &str,
        message_id: &str,
        text: &str,
        headers: &[(&str, &str)],
    ) -> Result<u16, reqwest::Error> {
        let body =
            json!({"message_id": message_id, "text": text, "sender": {"id": "u1", "name": "Ada"}});
        let url = format!("{}/inbound/{channel}", pod.base_url());
        let mut req = InboundRequest::json(secret, &body).request(&self.http, &url);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        Ok(req.send().await?.status().as_u16())
    }

    /// Posts until some live pod answers 202, starting with `first` (the index into the live
    /// pods, taken modulo). Transport errors and 503 are retried on the next pod, with the
    /// same `message_id` (a repeat is answered 202 and stored once). Panics on any other
    /// status. Returns the number of attempts.
    pub async fn inbound_until_accepted(
        &self,
        first: usize,
        channel: &str,
        secret: &str,
        message_id: &str,
        text: &str,
    ) -> u32 {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut i = first;
        let mut attempts = 0;
        loop {
            let pods = self.live_pods();
            assert!(!pods.is_empty(), "no live pod");
            let pod = &pods[i % pods.len()];
            attempts += 1;
            match self.inbound(pod, channel, secret, message_id, text).await {
                Ok(202) => return attempts,
                Ok(503) | Err(_) => {}
                Ok(other) => panic!("inbound {message_id} to {} answered {other}", pod.name),
            }
            assert!(
                Instant::now() < deadline,
                "inbound {message_id} never accepted"
            );
            i += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // SIGKILL every pod first (synchronously: Drop may run inside or outside a runtime),
        // so that none holds a lock the schema drop would wait for.
        let mut children: Vec<Child> = lock(&self.slots)
            .iter_mut()
            .filter_map(|s| s.child.take())
            .collect();
        for c in &mut children {
            let _ = c.start_kill();
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline
            && children
                .iter_mut()
                .any(|c| matches!(c.try_wait(), Ok(None)))
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        let pg_url = self.pg_url.clone();
        let schema = self.schema.clone();
        let bucket = self.bucket.clone();
        let failed = std::thread::panicking();
        let log_dir = self.log_dir.clone();
        // Own thread and runtime: Drop may run inside (or outside) the test's runtime.
        let cleanup = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                use sqlx::Connection;
                if let Ok(mut conn) = sqlx::PgConnection::connect(&pg_url).await {
                    let _ = sqlx::query("SET lock_timeout = '10s'")
                        .execute(&mut conn)
                        .await;
                    if let Err(e) = sqlx::query(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
                        .execute(&mut conn)
                        .await
                    {
                        eprintln!("dropping schema {schema}: {e}");
                    }
                }
                let client = s3_client(&s3_env());
                if let Ok(list) = client.list_objects_v2().bucket(&bucket).send().await {
                    for o in list.contents() {
                        if let Some(k) = o.key() {
                            let _ = client.delete_object().bucket(&bucket).key(k).send().await;
                        }
                    }
                }
                let _ = client.delete_bucket().bucket(&bucket).send().await;
            });
        });
        let _ = cleanup.join();
        if failed || std::env::var_os("SWITCHYARD_E2E_KEEP_LOGS").is_some() {
            eprintln!(
                "cluster {}: pod logs kept in {}",
                self.id,
                log_dir.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&log_dir);
        }
    }
}

// ---- private backends (scenario 6) -----------------------------------------------------

/// A `nats-server` or `redis-server` of one test, on its own port, restartable.
pub struct PrivateServer {
    pub port: u16,
    argv: Vec<String>,
    child: Option<Child>,
}

impl PrivateServer {
    pub async fn nats() -> Self {
        let port = free_port();
        Self::start(
            port,
            vec![
                "nats-server".into(),
                "-a".into(),
                "127.0.0.1".into(),
                "-p".into(),
                port.to_string(),
            ],
        )
        .await
    }

    pub async fn redis() -> Self {
        let port = free_port();
        let argv = [
            "redis-server",
            "--bind",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        Self::start(port, argv).await
    }

    async fn start(port: u16, argv: Vec<String>) -> Self {
        let mut s = Self {
            port,
            argv,
            child: None,
        };
        s.up().await;
        s
    }

    pub async fn up(&mut self) {
        assert!(self.child.is_none());
        let child = Command::new(&self.argv[0])
            .args(&self.argv[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", self.argv[0]));
        self.child = Some(child);
        let port = self.port;
        eventually(
            Duration::from_secs(10),
            &format!("{} on {port}", self.argv[0]),
            || async move { port_open(port).then_some(()) },
        )
        .await;
    }

    pub async fn down(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill().await;
        }
        let port = self.port;
        eventually(
            Duration::from_secs(10),
            "server port to close",
            || async move { (!port_open(port)).then_some(()) },
        )
        .await;
    }

    pub fn url(&self, scheme: &str) -> String {
        format!("{scheme}://127.0.0.1:{}", self.port)
    }
}

// ---- the fake chat system ----------------------------------------------------------------

/// A chat system's webhook endpoint on 127.0.0.1:0 with a fresh signing secret; counts
/// posts by `message_id` through the fake it derefs to.
pub struct Endpoint {
    pub url: String,
    pub secret: String,
    fake: FakeWebhook,
}

impl Endpoint {
    pub async fn start() -> Self {
        let secret = format!("whsec-{}", random_secret(12));
        let fake = FakeWebhook::start("/hooks", Some(&secret)).await;
        Self {
            url: fake.url().to_owned(),
            secret,
            fake,
        }
    }
}

impl std::ops::Deref for Endpoint {
    type Target = FakeWebhook;

    fn deref(&self) -> &FakeWebhook {
        &self.fake
    }
}

// ---- the data plane ----------------------------------------------------------------------

/// One `chat.message` as the simulator received it.
#[derive(Debug, Clone)]
pub struct Got {
    /// Which socket of the client (1, 2, ... in connection order).
    pub socket: u64,
    pub pod: String,
    pub channel: String,
    pub message_id: String,
    pub at: Instant,
}

/// Everything a client received: counts by `message_id` (the simulator's [`Deliveries`]) and
/// the full log in arrival order. Acks every `chat.message` while acking is on.
#[derive(Clone)]
pub struct Recorder {
    pub deliveries: Deliveries,
    log: Arc<Mutex<Vec<Got>>>,
    acking: Arc<AtomicBool>,
    descriptor_pushes: Arc<AtomicU64>,
}

impl Default for Recorder {
    fn default() -> Self {
        Self {
            deliveries: Deliveries::default(),
            log: Arc::default(),
            acking: Arc::new(AtomicBool::new(true)),
            descriptor_pushes: Arc::default(),
        }
    }
}

impl Recorder {
    pub fn set_acking(&self, on: bool) {
        self.acking.store(on, Ordering::SeqCst);
    }

    pub fn log(&self) -> Vec<Got> {
        lock(&self.log).clone()
    }

    /// Message ids of one channel in order of first arrival.
    pub fn first_order(&self, channel: &str) -> Vec<String> {
        let mut seen = std::collections::HashSet::new();
        lock(&self.log)
            .iter()
            .filter(|g| g.channel == channel && seen.insert(g.message_id.clone()))
            .map(|g| g.message_id.clone())
            .collect()
    }

    /// Arrivals of one socket (by number) in order.
    pub fn on_socket(&self, socket: u64) -> Vec<Got> {
        lock(&self.log)
            .iter()
            .filter(|g| g.socket == socket)
            .cloned()
            .collect()
    }

    pub async fn wait_distinct(&self, n: usize, timeout: Duration) -> bool {
        self.deliveries.wait_distinct(n, timeout).await
    }
}

/// Reads every push of a connection: `chat.message` is recorded and (while acking) acked.
async fn read_pushes(conn: Conn, rec: Recorder, socket: u64, pod: String) {
    loop {
        match conn.next_push(Duration::from_millis(500)).await {
            Some(env) => on_push(&conn, &rec, socket, &pod, env).await,
            None if conn.closed().is_some() => {
                for env in conn.drain_pushes().await {
                    on_push(&conn, &rec, socket, &pod, env).await;
                }
                return;
            }
            None => {}
        }
    }
}

async fn on_push(conn: &Conn, rec: &Recorder, socket: u64, pod: &str, env: Envelope) {
    match env.kind.as_str() {
        "chat.message" => {
            let id = env.str_at("/message_id").unwrap_or_default().to_owned();
            let channel = env.connector_channel_id.clone().unwrap_or_default();
            lock(&rec.log).push(Got {
                socket,
                pod: pod.to_owned(),
                channel,
                message_id: id.clone(),
                at: Instant::now(),
            });
            rec.deliveries.record(id);
            if rec.acking.load(Ordering::SeqCst) && conn.closed().is_none() {
                let _ = conn
                    .ack_chat_message(&env, AckStatus::Accepted, None, None)
                    .await;
            }
        }
        "connection.descriptor.push" => {
            rec.descriptor_pushes.fetch_add(1, Ordering::SeqCst);
        }
        _ => {}
    }
}

/// One data plane after hello, with a push reader recording into a [`Recorder`].
pub struct Socket {
    pub conn: Conn,
    pub sim: Sim,
    pub pod: String,
    pub number: u64,
    pub connector_id: String,
    reader: JoinHandle<()>,
}

impl Drop for Socket {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Socket {
    /// Connects to `pod`, says hello (with `connector_id` when reconnecting) and starts
    /// recording pushes.
    pub async fn open(
        pod: &PodInfo,
        api_key: &str,
        connector_id: Option<&str>,
        rec: &Recorder,
        number: u64,
    ) -> Result<Self, String> {
        let sim = Sim::new(&pod.base_url(), Some(api_key))
            .map_err(|e| e.to_string())?
            .with_frame_recording(false);
        let conn = sim
            .connect()
            .await
            .map_err(|e| format!("connect {}: {e}", pod.name))?;
        let ack = conn
            .hello(CARD_ID, connector_id, &[IM_V2])
            .await
            .map_err(|e| format!("hello: {e}"))?;
        let ack = ack
            .expect_kind("connector.hello.ack")
            .map_err(|e| format!("hello on {}: {e}", pod.name))?;
        let id = ack.str_at("/connector_id").unwrap_or_default().to_owned();
        if let Some(old) = connector_id.filter(|old| *old != id) {
            return Err(format!(
                "wrong: hello with connector_id {old} on {} was answered with {id}",
                pod.name
            ));
        }
        let reader = tokio::spawn(read_pushes(
            conn.clone(),
            rec.clone(),
            number,
            pod.name.clone(),
        ));
        Ok(Self {
            conn,
            sim,
            pod: pod.name.clone(),
            number,
            connector_id: id,
            reader,
        })
    }

    /// `channel.open` (None = new); returns the id and the Descriptor's connection status.
    pub async fn open_channel(&self, channel: Option<&str>) -> Result<(String, String), String> {
        let ack = self
            .conn
            .open_channel(channel)
            .await
            .map_err(|e| format!("channel.open: {e}"))?;
        let ack = ack
            .expect_kind("channel.open.ack")
            .map_err(|e| format!("channel.open on {}: {e}", self.pod))?;
        let id = ack.connector_channel_id.clone().unwrap_or_default();
        if let Some(old) = channel.filter(|old| *old != id) {
            return Err(format!(
                "wrong: channel.open of {old} on {} was answered with {id}",
                self.pod
            ));
        }
        let status = ack
            .str_at("/connection_descriptor/connection/status")
            .unwrap_or_default()
            .to_owned();
        Ok((id, status))
    }

    /// Opens a new channel and binds it to `endpoint` with the form flow.
    pub async fn bind_new_channel(&self, endpoint: &Endpoint) -> String {
        let (ch, _) = self.open_channel(None).await.expect("open new channel");
        let input = json!({"endpoint_url": endpoint.url, "signing_secret": endpoint.secret});
        let ack = self
            .conn
            .auth_start(&ch, FLOW_BINDING, input)
            .await
            .expect("auth.start")
            .expect_kind("auth.start.ack")
            .expect("auth.start.ack");
        assert_eq!(
            ack.str_at("/status"),
            Some("authenticated"),
            "form flow authenticates: {ack:?}"
        );
        ch
    }

    pub fn schema_violations(&self) -> Vec<String> {
        self.sim.schema_violations()
    }
}

// ---- the reconnecting xAgent ---------------------------------------------------------------

/// Which live pod a client reconnects to (a load balancer's choice, made explicit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefer {
    Oldest,
    Newest,
}

/// One completed reconnect.
#[derive(Debug, Clone)]
pub struct Reconnect {
    pub from: String,
    pub to: String,
    pub close_code: u16,
    /// When the client saw the socket end.
    pub lost_at: Instant,
    /// When every channel was open again on the new socket.
    pub restored_at: Instant,
    pub channels: usize,
    /// Connection attempts (pods tried) until it worked.
    pub attempts: u32,
    /// Descriptor connection status of each re-opened channel.
    pub statuses: Vec<String>,
}

struct AgentInner {
    cluster: Arc<Cluster>,
    api_key: String,
    rec: Recorder,
    connector_id: Mutex<String>,
    channels: Mutex<Vec<String>>,
    current: Mutex<Arc<Socket>>,
    sockets: AtomicU64,
    prefer: Prefer,
    hold: watch::Sender<bool>,
    reconnects: Mutex<Vec<Reconnect>>,
    failures: Mutex<Vec<String>>,
    violations: Mutex<Vec<String>>,
    changed: Notify,
}

/// xAgent for one tenant: remembers its connector_id and channels; when its socket closes
/// (a 1012 drain or a dead pod) it reconnects to another live pod, says hello with the same
/// connector_id and re-opens every channel with its old id.
pub struct Agent {
    inner: Arc<AgentInner>,
    supervisor: JoinHandle<()>,
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.supervisor.abort();
    }
}

impl Agent {
    /// Connects to `pod` with a new connector_id.
    pub async fn connect(
        cluster: &Arc<Cluster>,
        tenant: &Tenant,
        pod: &PodInfo,
        prefer: Prefer,
    ) -> Self {
        let rec = Recorder::default();
        let socket = Socket::open(pod, &tenant.api_key, None, &rec, 1)
            .await
            .expect("first connect");
        let inner = Arc::new(AgentInner {
            cluster: cluster.clone(),
            api_key: tenant.api_key.clone(),
            rec,
            connector_id: Mutex::new(socket.connector_id.clone()),
            channels: Mutex::new(Vec::new()),
            current: Mutex::new(Arc::new(socket)),
            sockets: AtomicU64::new(1),
            prefer,
            hold: watch::Sender::new(false),
            reconnects: Mutex::default(),
            failures: Mutex::default(),
            violations: Mutex::default(),
            changed: Notify::new(),
        });
        let supervisor = tokio::spawn(supervise(inner.clone()));
        Self { inner, supervisor }
    }

    pub fn recorder(&self) -> &Recorder {
        &self.inner.rec
    }

    pub fn connector_id(&self) -> String {
        lock(&self.inner.connector_id).clone()
    }

    pub fn channels(&self) -> Vec<String> {
        lock(&self.inner.channels).clone()
    }

    /// The socket in use (the last one whose channels were all re-opened).
    pub fn socket(&self) -> Arc<Socket> {
        lock(&self.inner.current).clone()
    }

    pub fn conn(&self) -> Conn {
        self.socket().conn.clone()
    }

    /// Opens and binds `n` new channels on the current socket.
    pub async fn bind_channels(&self, n: usize, endpoint: &Endpoint) -> Vec<String> {
        let socket = self.socket();
        let mut out = Vec::new();
        for _ in 0..n {
            let ch = socket.bind_new_channel(endpoint).await;
            lock(&self.inner.channels).push(ch.clone());
            out.push(ch);
        }
        out
    }

    /// While held, a lost socket is not replaced (the connector_id looks offline).
    pub fn hold_reconnects(&self, hold: bool) {
        self.inner.hold.send_replace(hold);
    }

    pub fn reconnects(&self) -> Vec<Reconnect> {
        lock(&self.inner.reconnects).clone()
    }

    /// Waits until at least `n` reconnects completed.
    pub async fn wait_reconnects(&self, n: usize, timeout: Duration) -> Vec<Reconnect> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let changed = self.inner.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let r = self.reconnects();
            if r.len() >= n {
                return r;
            }
            let failures = lock(&self.inner.failures).clone();
            assert!(failures.is_empty(), "reconnect failed: {failures:?}");
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                panic!(
                    "only {} of {n} reconnects within {timeout:?}; failures {:?}",
                    self.reconnects().len(),
                    lock(&self.inner.failures)
                );
            }
        }
    }

    /// Reconnect failures and protocol surprises seen so far.
    pub fn problems(&self) -> Vec<String> {
        let mut p = lock(&self.inner.failures).clone();
        p.extend(lock(&self.inner.violations).iter().cloned());
        p.extend(self.socket().schema_violations());
        p
    }
}

fn pick_order(pods: Vec<PodInfo>, prefer: Prefer, avoid: &str) -> Vec<PodInfo> {
    let mut pods: Vec<PodInfo> = pods.into_iter().filter(|p| p.name != avoid).collect();
    if prefer == Prefer::Newest {
        pods.reverse();
    }
    pods
}

async fn supervise(inner: Arc<AgentInner>) {
    loop {
        let socket = lock(&inner.current).clone();
        let mut closed = None;
        while closed.is_none() {
            closed = socket.conn.wait_closed(Duration::from_secs(3600)).await;
        }
        let lost_at = Instant::now();
        let close_code = closed.map(|c| c.0).unwrap_or_default();
        let mut hold = inner.hold.subscribe();
        let _ = hold.wait_for(|h| !*h).await;
        let connector_id = lock(&inner.connector_id).clone();
        let mut attempts = 0u32;
        let restored = 'outer: loop {
            for pod in pick_order(inner.cluster.live_pods(), inner.prefer, &socket.pod) {
                attempts += 1;
                let number = inner.sockets.fetch_add(1, Ordering::SeqCst) + 1;
                let s = match Socket::open(
                    &pod,
                    &inner.api_key,
                    Some(&connector_id),
                    &inner.rec,
                    number,
                )
                .await
                {
                    Ok(s) => s,
                    Err(e) => {
                        eprintln!("agent: reconnect to {} failed: {e}", pod.name);
                        if e.starts_with("wrong:") {
                            lock(&inner.violations).push(e);
                        }
                        continue;
                    }
                };
                let channels = lock(&inner.channels).clone();
                let opened =
                    futures::future::join_all(channels.iter().map(|c| s.open_channel(Some(c))))
                        .await;
                let mut statuses = Vec::new();
                let mut ok = true;
                for r in opened {
                    match r {
                        Ok((_, status)) => statuses.push(status),
                        Err(e) => {
                            eprintln!("agent: re-open on {} failed: {e}", pod.name);
                            if e.starts_with("wrong:") {
                                lock(&inner.violations).push(e);
                            }
                            ok = false;
                        }
                    }
                }
                if !ok {
                    continue;
                }
                let restored_at = Instant::now();
                let r = Reconnect {
                    from: socket.pod.clone(),
                    to: pod.name.clone(),
                    close_code,
                    lost_at,
                    restored_at,
                    channels: channels.len(),
                    attempts,
                    statuses,
                };
                *lock(&inner.current) = Arc::new(s);
                break 'outer r;
            }
            if lost_at.elapsed() > Duration::from_secs(60) {
                lock(&inner.failures).push(format!(
                    "no pod took the client back within 60s after {} closed",
                    socket.pod
                ));
                inner.changed.notify_waiters();
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let v = socket.schema_violations();
        if !v.is_empty() {
            lock(&inner.violations).extend(v);
        }
        eprintln!(
            "agent: {} -> {} (close {}) in {:?}, {} channels, {} attempts",
            restored.from,
            restored.to,
            restored.close_code,
            restored.restored_at - restored.lost_at,
            restored.channels,
            restored.attempts
        );
        lock(&inner.reconnects).push(restored);
        inner.changed.notify_waiters();
    }
}

// ---- assertions ----------------------------------------------------------------------------

/// Every id delivered exactly once; panics listing missing and duplicated ids otherwise.
pub fn assert_exactly_once(rec: &Recorder, expected: &[String]) {
    let counts = rec.deliveries.snapshot();
    let missing: Vec<&String> = expected
        .iter()
        .filter(|id| !counts.contains_key(*id))
        .collect();
    let dups = rec.deliveries.duplicates();
    let unexpected: Vec<&String> = counts.keys().filter(|k| !expected.contains(k)).collect();
    assert!(
        missing.is_empty() && dups.is_empty() && unexpected.is_empty(),
        "expected {} ids once each; missing {} {:?}, duplicated {} {:?}, unexpected {:?}",
        expected.len(),
        missing.len(),
        missing.iter().take(10).collect::<Vec<_>>(),
        dups.len(),
        dups.iter().take(10).collect::<Vec<_>>(),
        unexpected.iter().take(10).collect::<Vec<_>>()
    );
}

/// A tool call's answer, classified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolOutcome {
    /// Ran; the endpoint saw this `message_id`.
    Sent(String),
    /// Refused or interrupted in a way the caller may retry with the same tool_call_id.
    Retryable(String),
    Failed(String),
}

/// Error codes after which xAgent retries the same call.
pub const RETRYABLE_CODES: &[&str] = &[
    "draining",
    "busy",
    "unavailable",
    "connector_channel_unavailable",
    "channel_not_open",
];

pub fn classify_tool(r: Result<Envelope, SimError>) -> ToolOutcome {
    match r {
        Ok(env) => match env.error_code() {
            None if env.kind == "tool.invoke.ack" => match env.str_at("/result/message_id") {
                Some(id) => ToolOutcome::Sent(id.to_owned()),
                None => ToolOutcome::Failed(format!("ack without result.message_id: {env:?}")),
            },
            Some(code) if RETRYABLE_CODES.contains(&code) => {
                ToolOutcome::Retryable(code.to_owned())
            }
            _ => ToolOutcome::Failed(format!("{} {:?}", env.kind, env.error)),
        },
        // No answer: the outcome is unknown, so the same tool_call_id is sent again.
        Err(SimError::Closed) => ToolOutcome::Retryable("socket closed".into()),
        Err(SimError::Timeout { .. }) => ToolOutcome::Retryable("no answer".into()),
        Err(SimError::Ws(e)) => ToolOutcome::Retryable(format!("ws: {e}")),
        Err(e) => ToolOutcome::Failed(e.to_string()),
    }
}

/// Per-message arrival latency summary (ms) for reports.
pub fn percentile(sorted_ms: &[f64], p: f64) -> f64 {
    if sorted_ms.is_empty() {
        return 0.0;
    }
    let i = ((sorted_ms.len() - 1) as f64 * p).round() as usize;
    sorted_ms[i]
}

// ---- xAgent on a provider's prefix -----------------------------------------------------

/// A simulator for the connector mounted at `prefix` (`/feishu`, `/wechat`) of `pod`.
pub fn prefix_sim(pod: &PodInfo, prefix: &str, key: &str) -> Sim {
    Sim::new(&format!("http://{}{prefix}", pod.addr), Some(key)).expect("sim")
}

/// A connection after `connector.hello` for `card` (im.v2), and the connector id it got.
pub async fn hello_card(sim: &Sim, card: &str, connector_id: Option<&str>) -> (Conn, String) {
    switchyard_e2e::hello_card(sim, card, connector_id, &[IM_V2]).await
}

/// Opens `ch` (a new channel when None); the channel id the pod answered.
pub async fn open_channel_on(conn: &Conn, ch: Option<&str>) -> String {
    conn.open_channel(ch)
        .await
        .expect("open")
        .expect_kind("channel.open.ack")
        .expect("open ack")
        .connector_channel_id
        .clone()
        .expect("channel id")
}

/// Live pods whose log holds `line`, with how often (a later holder logs it again).
pub fn pods_logging(cluster: &Cluster, line: &str) -> Vec<(String, usize)> {
    cluster
        .live_pods()
        .iter()
        .filter_map(|p| {
            let log = std::fs::read_to_string(&p.log).unwrap_or_default();
            let n = log.matches(line).count();
            (n > 0).then(|| (p.name.clone(), n))
        })
        .collect()
}
