//! The pods under test: real `switchyard` processes started, probed, measured, killed and
//! drained by the loadtest, plus the shared backends' per-run namespaces (Postgres schema,
//! NATS subject prefix, Redis key prefix) and their cleanup.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use base64::Engine as _;
use serde::Serialize;
use tokio::process::{Child, Command};

use crate::args::{Args, Mode};

const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Longer than the pods' default drain timeout (30 s) so a drain is never cut short.
const STOP_TIMEOUT: Duration = Duration::from_secs(45);

/// The `switchyard` binary: `--bin`, else release, else debug, looked up from the current
/// directory and from the workspace this crate was built in.
pub fn find_binary(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(p) = explicit {
        if p.is_file() {
            return Ok(p.to_path_buf());
        }
        bail!("--bin {} does not exist", p.display());
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for profile in ["release", "debug"] {
        for root in [Path::new("."), workspace.as_path()] {
            let p = root.join("target").join(profile).join("switchyard");
            if p.is_file() {
                return Ok(p.canonicalize().unwrap_or(p));
            }
        }
    }
    bail!(
        "no switchyard binary in target/release or target/debug; run `cargo build --release -p switchyard` or pass --bin"
    )
}

fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(l.local_addr()?.port())
}

/// Why a pod did not start.
enum Start {
    /// Another process took one of its ports first.
    PortTaken(anyhow::Error),
    Failed(anyhow::Error),
}

impl<E: Into<anyhow::Error>> From<E> for Start {
    fn from(e: E) -> Self {
        Start::Failed(e.into())
    }
}

fn random_hex(bytes: usize) -> String {
    let v: Vec<u8> = (0..bytes).map(|_| rand::random::<u8>()).collect();
    hex::encode(v)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PodState {
    Serving,
    /// SIGTERM sent; the pod drains and exits.
    Draining,
    Killed,
    Exited,
}

/// One `/proc` reading of a pod.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct ProcSample {
    pub rss_kib: u64,
    /// Peak RSS (VmHWM).
    pub peak_rss_kib: u64,
    pub cpu_seconds: f64,
}

/// Reads VmRSS/VmHWM from `/proc/<pid>/status` and utime+stime from `/proc/<pid>/stat`.
pub fn proc_sample(pid: u32, clk_tck: f64) -> Option<ProcSample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces; fields are counted after its closing paren.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (state); utime and stime are fields 14 and 15.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ProcSample {
        rss_kib: kib("VmRSS:"),
        peak_rss_kib: kib("VmHWM:"),
        cpu_seconds: ticks as f64 / clk_tck,
    })
}

/// Seconds since process `pid` started (`/proc/<pid>/stat` starttime against `/proc/uptime`).
pub fn proc_uptime(pid: u32, clk_tck: f64) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    // fields[0] is field 3; starttime is field 22.
    let start_ticks: f64 = rest.split_whitespace().nth(19)?.parse().ok()?;
    let boot: f64 = std::fs::read_to_string("/proc/uptime")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some((boot - start_ticks / clk_tck).max(0.0))
}

/// Clock ticks per second for `/proc/<pid>/stat` (no libc: the workspace forbids `unsafe`).
pub fn clk_tck() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|t| *t > 0.0)
        .unwrap_or(100.0)
}

pub struct Pod {
    pub name: String,
    pub pid: u32,
    /// `http://127.0.0.1:PORT`, the public listener.
    pub base_url: String,
    pub metrics_url: String,
    /// `https://127.0.0.1:PORT`, the mTLS listener of agent hosts.
    pub hosts_tls_url: String,
    pub log: PathBuf,
    pub started: Instant,
    /// `None` for the deployment under `--target`, which the loadtest did not start.
    child: tokio::sync::Mutex<Option<Child>>,
    state: Mutex<PodState>,
    last: Mutex<Option<ProcSample>>,
}

impl Pod {
    /// The `--target` deployment: not a process of ours, never signalled.
    pub fn is_external(&self) -> bool {
        self.pid == 0
    }

    pub fn state(&self) -> PodState {
        *self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_state(&self, s: PodState) {
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = s;
    }

    /// Refreshes the last `/proc` sample while the process exists; returns the latest one.
    pub fn sample(&self, clk_tck: f64) -> Option<ProcSample> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if matches!(self.state(), PodState::Serving | PodState::Draining)
            && !self.is_external()
            && let Some(s) = proc_sample(self.pid, clk_tck)
        {
            *last = Some(s);
        }
        *last
    }

    /// SIGKILL, then reap.
    pub async fn kill(&self) {
        let mut child = self.child.lock().await;
        let Some(child) = child.as_mut() else { return };
        self.set_state(PodState::Killed);
        let _ = child.start_kill();
        let _ = child.wait().await;
    }

    /// SIGTERM: the pod turns not-ready, drains and exits on its own.
    pub fn term(&self) -> anyhow::Result<()> {
        if self.is_external() {
            bail!("{} was not started by the loadtest", self.name);
        }
        self.set_state(PodState::Draining);
        let status = std::process::Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status()
            .context("running kill -TERM")?;
        if !status.success() {
            bail!("kill -TERM {} failed", self.pid);
        }
        Ok(())
    }

    /// Waits for the process to end (SIGKILL after `timeout`); returns its exit description.
    pub async fn wait_exit(&self, timeout: Duration) -> String {
        let mut child = self.child.lock().await;
        let Some(child) = child.as_mut() else {
            return "not started by the loadtest".into();
        };
        let r = match tokio::time::timeout(timeout, child.wait()).await {
            Ok(Ok(st)) => st.to_string(),
            Ok(Err(e)) => format!("wait failed: {e}"),
            Err(_) => {
                let _ = child.start_kill();
                let _ = child.wait().await;
                format!("did not exit within {timeout:?}; killed")
            }
        };
        if self.state() != PodState::Killed {
            self.set_state(PodState::Exited);
        }
        r
    }

    /// The pod's own `switchyard_*` metric samples (`/metrics`), also saved next to its log.
    pub async fn scrape_metrics(&self) -> Vec<String> {
        let Some(text) = fetch_metrics(&self.metrics_url).await else {
            return Vec::new();
        };
        let _ = std::fs::write(self.log.with_extension("metrics"), &text);
        switchyard_samples(&text)
    }

    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log, lines)
    }
}

/// `GET <base>/metrics`; `None` when it does not answer 200 within 5 s.
pub async fn fetch_metrics(base: &str) -> Option<String> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .ok()?;
    match client.get(format!("{base}/metrics")).send().await {
        Ok(r) if r.status().is_success() => r.text().await.ok(),
        _ => None,
    }
}

/// The `switchyard_*` sample lines of a Prometheus text exposition.
pub fn switchyard_samples(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| l.starts_with("switchyard_"))
        .map(str::to_owned)
        .collect()
}

fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Per-run namespaces in the shared backends, removed at the end.
#[derive(Debug, Clone)]
struct Shared {
    postgres_url: String,
    schema: String,
    redis_url: String,
    redis_prefix: String,
}

/// The pods of one run and how to start more.
pub struct Fleet {
    bin: PathBuf,
    mode: Mode,
    dir: PathBuf,
    env: Vec<(String, String)>,
    shared: Option<Shared>,
    pods: Mutex<Vec<Arc<Pod>>>,
    next: AtomicUsize,
    pub clk_tck: f64,
    /// Whether the pods share a file store (embedded: one pod; cluster: S3).
    pub shared_files: bool,
}

impl Fleet {
    /// Builds the pods' environment and the run's namespaces in the shared backends.
    pub async fn prepare(args: &Args, bin: PathBuf, dir: PathBuf) -> anyhow::Result<Self> {
        let mut env = vec![
            (
                "SWITCHYARD_LOG__LEVEL".to_owned(),
                args.pod_log_level.clone(),
            ),
            // The fake chat systems listen on loopback, which tenant URLs may not reach by
            // default.
            (
                "SWITCHYARD_OUTBOUND__ALLOW_PRIVATE".to_owned(),
                "127.0.0.0/8,::1/128".to_owned(),
            ),
        ];
        let mut shared = None;
        let mut shared_files = true;
        if args.mode == Mode::Cluster {
            let tag = random_hex(4);
            let schema = format!("loadtest_{tag}");
            let redis_prefix = format!("loadtest_{tag}");
            let signing = random_hex(32);
            let enc_key: [u8; 32] = rand::random();
            let encryption = base64::engine::general_purpose::STANDARD.encode(enc_key);
            env.extend([
                (
                    "SWITCHYARD_DATABASE_URL".to_owned(),
                    args.postgres_url.clone(),
                ),
                ("SWITCHYARD_DATABASE_SCHEMA".to_owned(), schema.clone()),
                ("SWITCHYARD_NATS_URL".to_owned(), args.nats_url.clone()),
                (
                    "SWITCHYARD_NATS_SUBJECT_PREFIX".to_owned(),
                    format!("loadtest_{tag}"),
                ),
                ("SWITCHYARD_REDIS_URL".to_owned(), args.redis_url.clone()),
                (
                    "SWITCHYARD_REDIS_KEY_PREFIX".to_owned(),
                    redis_prefix.clone(),
                ),
                ("SWITCHYARD_SIGNING_KEYS".to_owned(), signing),
                ("SWITCHYARD_ENCRYPTION_KEYS".to_owned(), encryption),
            ]);
            match &args.s3_bucket {
                Some(bucket) => {
                    env.push(("SWITCHYARD_S3__BUCKET".to_owned(), bucket.clone()));
                    env.push(("SWITCHYARD_S3__REGION".to_owned(), args.s3_region.clone()));
                    if let Some(ep) = &args.s3_endpoint {
                        env.push(("SWITCHYARD_S3__ENDPOINT".to_owned(), ep.clone()));
                        env.push(("SWITCHYARD_S3__FORCE_PATH_STYLE".to_owned(), "true".into()));
                    }
                }
                None => shared_files = false,
            }
            shared = Some(Shared {
                postgres_url: args.postgres_url.clone(),
                schema,
                redis_url: args.redis_url.clone(),
                redis_prefix,
            });
        }
        env.extend(args.pod_env.iter().cloned());
        let fleet = Self {
            bin,
            mode: args.mode,
            dir,
            env,
            shared,
            pods: Mutex::new(Vec::new()),
            next: AtomicUsize::new(0),
            clk_tck: clk_tck(),
            shared_files,
        };
        Ok(fleet)
    }

    /// `--target`: the existing deployment as the only "pod" (public base URL; probes and
    /// metrics go to `--metrics-url`), nothing to start or stop.
    pub fn external(args: &Args, dir: PathBuf) -> anyhow::Result<Self> {
        let base = args
            .target
            .as_deref()
            .context("--target")?
            .trim_end_matches('/')
            .to_owned();
        let pod = Arc::new(Pod {
            name: "target".into(),
            pid: 0,
            base_url: base,
            metrics_url: args
                .metrics_urls
                .first()
                .map(|u| u.trim_end_matches('/').to_owned())
                .unwrap_or_default(),
            hosts_tls_url: String::new(),
            log: dir.join("target.log"),
            started: Instant::now(),
            child: tokio::sync::Mutex::new(None),
            state: Mutex::new(PodState::Serving),
            last: Mutex::new(None),
        });
        Ok(Self {
            bin: PathBuf::new(),
            mode: Mode::Embedded,
            dir,
            env: Vec::new(),
            shared: None,
            pods: Mutex::new(vec![pod]),
            next: AtomicUsize::new(1),
            clk_tck: clk_tck(),
            // A deployment serves its own files to every pod (S3 or one pod).
            shared_files: true,
        })
    }

    /// What the probes ask for `/livez` and `/readyz`: `(name, internal listener URL)`.
    pub fn probe_targets(&self, metrics_urls: &[String]) -> Vec<(String, String)> {
        let serving = self.serving();
        if serving.iter().any(|p| p.is_external()) {
            return metrics_urls
                .iter()
                .enumerate()
                .map(|(i, u)| (format!("metrics-{i}"), u.trim_end_matches('/').to_owned()))
                .collect();
        }
        serving
            .into_iter()
            .map(|p| (p.name.clone(), p.metrics_url.clone()))
            .collect()
    }

    /// The run's Postgres schema (cluster mode).
    pub fn pg_schema(&self) -> Option<&str> {
        self.shared.as_ref().map(|s| s.schema.as_str())
    }

    /// The directory of the pods' data and logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Cluster mode: applies the schema (`switchyard migrate`) to the run's Postgres schema.
    pub async fn migrate(&self) -> anyhow::Result<()> {
        if self.mode == Mode::Cluster {
            let out = self.admin(&["migrate"]).await?;
            println!("migrate: {}", out.trim());
        }
        Ok(())
    }

    /// Embedded pods share one data dir (replacements restart on the same SQLite file).
    fn data_dir(&self, index: usize) -> PathBuf {
        match self.mode {
            Mode::Embedded => self.dir.join("data"),
            Mode::Cluster => self.dir.join(format!("pod-{index}-data")),
        }
    }

    fn command(&self, data_dir: &Path) -> Command {
        let mut cmd = Command::new(&self.bin);
        // The operator's own SWITCHYARD_* settings must not leak into the pods under test.
        for (k, _) in std::env::vars() {
            if k.starts_with("SWITCHYARD_") {
                cmd.env_remove(k);
            }
        }
        cmd.env("SWITCHYARD_DATA_DIR", data_dir)
            .env("NO_COLOR", "1");
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd.kill_on_drop(true);
        cmd
    }

    /// Runs an administrative subcommand with the pods' settings; returns its stdout.
    pub async fn admin(&self, argv: &[&str]) -> anyhow::Result<String> {
        let mut cmd = self.command(&self.data_dir(0));
        cmd.args(argv).stdin(Stdio::null());
        let out = cmd
            .output()
            .await
            .with_context(|| format!("running {} {}", self.bin.display(), argv.join(" ")))?;
        if !out.status.success() {
            bail!(
                "`switchyard {}` failed ({}): {}",
                argv.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Creates a tenant; returns `(tenant_id, api_key)`.
    pub async fn create_tenant(&self, name: &str) -> anyhow::Result<(String, String)> {
        let out = self.admin(&["tenant", "create", name, "--json"]).await?;
        let last = out
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        let v: serde_json::Value = serde_json::from_str(last)
            .with_context(|| format!("tenant create printed {last:?}"))?;
        let get = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_owned);
        match (get("tenant_id"), get("api_key")) {
            (Some(t), Some(k)) => Ok((t, k)),
            _ => bail!("tenant create --json printed no tenant_id/api_key: {last}"),
        }
    }

    /// Starts a pod on fresh ports and waits for `/readyz`. A port found free can be taken
    /// before the pod binds it (the ports come from the range outgoing connections use, and
    /// the loadtest and its pods open many), so a pod that could not bind is started again on
    /// other ports, twice at most.
    pub async fn start_pod(&self) -> anyhow::Result<Arc<Pod>> {
        let index = self.next.fetch_add(1, Ordering::SeqCst);
        let mut tries = 0;
        loop {
            tries += 1;
            match self.start_pod_as(index).await {
                Err(Start::PortTaken(e)) if tries < 3 => {
                    eprintln!("{e:#}\nstarting it again on other ports");
                }
                Err(Start::PortTaken(e) | Start::Failed(e)) => return Err(e),
                Ok(pod) => return Ok(pod),
            }
        }
    }

    async fn start_pod_as(&self, index: usize) -> Result<Arc<Pod>, Start> {
        let name = format!("pod-{index}");
        let data_dir = self.data_dir(index);
        std::fs::create_dir_all(&data_dir)?;
        let (port, mport, tport) = (free_port()?, free_port()?, free_port()?);
        let log = self.dir.join(format!("{name}.log"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("creating {}", log.display()))?;
        // Where this start's lines begin (an earlier start of the same pod wrote above).
        let log_from = file.metadata()?.len();
        let mut cmd = self.command(&data_dir);
        cmd.arg("serve")
            .env("SWITCHYARD_LISTEN", format!("127.0.0.1:{port}"))
            .env("SWITCHYARD_METRICS_LISTEN", format!("127.0.0.1:{mport}"))
            .env("SWITCHYARD_HOSTS_TLS_LISTEN", format!("127.0.0.1:{tport}"))
            .env("SWITCHYARD_POD_ID", format!("loadtest-{name}"))
            .stdin(Stdio::null())
            .stdout(Stdio::from(file.try_clone()?))
            .stderr(Stdio::from(file));
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", self.bin.display()))?;
        let pid = child.id().context("pod exited at once")?;
        let pod = Arc::new(Pod {
            name,
            pid,
            base_url: format!("http://127.0.0.1:{port}"),
            metrics_url: format!("http://127.0.0.1:{mport}"),
            hosts_tls_url: format!("https://127.0.0.1:{tport}"),
            log,
            started: Instant::now(),
            child: tokio::sync::Mutex::new(Some(child)),
            state: Mutex::new(PodState::Serving),
            last: Mutex::new(None),
        });
        self.pods
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(pod.clone());
        if let Err(e) = wait_ready(&pod).await {
            pod.kill().await;
            self.pods
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|p| !Arc::ptr_eq(p, &pod));
            let e = anyhow::anyhow!(
                "{} did not become ready: {e}\n--- {} ---\n{}",
                pod.name,
                pod.log.display(),
                pod.log_tail(30)
            );
            let this_start = std::fs::read(&pod.log)
                .map(|b| {
                    String::from_utf8_lossy(b.get(log_from as usize..).unwrap_or(&[])).into_owned()
                })
                .unwrap_or_default();
            return Err(if this_start.contains("Address already in use") {
                Start::PortTaken(e)
            } else {
                Start::Failed(e)
            });
        }
        Ok(pod)
    }

    /// Every pod ever started, in start order.
    pub fn all(&self) -> Vec<Arc<Pod>> {
        self.pods.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Pods that accept new work.
    pub fn serving(&self) -> Vec<Arc<Pod>> {
        self.all()
            .into_iter()
            .filter(|p| p.state() == PodState::Serving)
            .collect()
    }

    pub fn sample_all(&self) {
        for p in self.all() {
            p.sample(self.clk_tck);
        }
    }

    /// Drains every live pod (SIGTERM), killing those that do not exit in time.
    pub async fn stop_all(&self) {
        let live: Vec<_> = self
            .all()
            .into_iter()
            .filter(|p| {
                !p.is_external() && matches!(p.state(), PodState::Serving | PodState::Draining)
            })
            .collect();
        for p in &live {
            if p.state() == PodState::Serving
                && let Err(e) = p.term()
            {
                eprintln!("{}: {e}", p.name);
            }
        }
        for p in &live {
            let how = p.wait_exit(STOP_TIMEOUT).await;
            if !how.contains("exit status: 0") {
                eprintln!("{} stopped: {how}", p.name);
            }
        }
    }

    /// Drops the run's Postgres schema and Redis keys (cluster mode).
    pub async fn cleanup_shared(&self) -> Vec<String> {
        let mut notes = Vec::new();
        let Some(s) = &self.shared else { return notes };
        match drop_schema(&s.postgres_url, &s.schema).await {
            Ok(()) => notes.push(format!("dropped Postgres schema {}", s.schema)),
            Err(e) => notes.push(format!(
                "could not drop Postgres schema {}: {e:#}",
                s.schema
            )),
        }
        match delete_redis_keys(&s.redis_url, &s.redis_prefix).await {
            Ok(n) => notes.push(format!("deleted {n} Redis keys under {}", s.redis_prefix)),
            Err(e) => notes.push(format!(
                "could not clean Redis prefix {}: {e:#}",
                s.redis_prefix
            )),
        }
        notes
    }
}

async fn wait_ready(pod: &Pod) -> anyhow::Result<()> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()?;
    let url = format!("{}/readyz", pod.metrics_url);
    let deadline = Instant::now() + READY_TIMEOUT;
    let mut last = String::from("no answer");
    while Instant::now() < deadline {
        if let Some(child) = pod.child.lock().await.as_mut()
            && let Ok(Some(st)) = child.try_wait()
        {
            bail!("exited with {st}");
        }
        match client.get(&url).send().await {
            Ok(r) if r.status().is_success() => return Ok(()),
            Ok(r) => last = format!("{} {}", r.status(), r.text().await.unwrap_or_default()),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("/readyz not ready after {READY_TIMEOUT:?} (last: {last})")
}

async fn drop_schema(url: &str, schema: &str) -> anyhow::Result<()> {
    use sqlx::Connection as _;
    let mut conn = sqlx::PgConnection::connect(url).await?;
    // The name is ours (loadtest_ + hex), so quoting is not needed.
    sqlx::query(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .execute(&mut conn)
        .await?;
    conn.close().await?;
    Ok(())
}

async fn delete_redis_keys(url: &str, prefix: &str) -> anyhow::Result<usize> {
    let client = redis::Client::open(url)?;
    let mut con = client.get_multiplexed_async_connection().await?;
    let mut cursor: u64 = 0;
    let mut deleted = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut con)
            .await?;
        if !keys.is_empty() {
            let n: usize = redis::cmd("DEL").arg(&keys).query_async(&mut con).await?;
            deleted += n;
        }
        if next == 0 {
            return Ok(deleted);
        }
        cursor = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_proc_entry() {
        let s = proc_sample(std::process::id(), clk_tck()).expect("own /proc entry");
        assert!(s.rss_kib > 0 && s.peak_rss_kib >= s.rss_kib);
        assert!(s.cpu_seconds >= 0.0);
        let up = proc_uptime(std::process::id(), clk_tck()).expect("own uptime");
        assert!((0.0..3600.0).contains(&up), "{up}");
    }
}
