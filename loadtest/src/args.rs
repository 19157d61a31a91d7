//! The command line.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use crate::stages::Profile;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// One pod on SQLite in a temporary directory, in-process bus and ephemeral state.
    Embedded,
    /// N pods sharing Postgres, NATS, Redis and (optionally) S3.
    Cluster,
}

#[derive(Debug, Clone, Parser)]
#[command(
    name = "switchyard-loadtest",
    version,
    about = "Drives real Switchyard pods with simulated xAgent backends and a fake webhook target"
)]
pub struct Args {
    /// The `switchyard` binary; default target/release/switchyard, else target/debug/switchyard.
    #[arg(long)]
    pub bin: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "embedded")]
    pub mode: Mode,
    /// Number of pods (cluster mode).
    #[arg(long, default_value_t = 3)]
    pub pods: usize,
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/test")]
    pub postgres_url: String,
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    pub nats_url: String,
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    pub redis_url: String,
    /// S3 endpoint for the shared file store (cluster mode); credentials from AWS_* variables.
    #[arg(long)]
    pub s3_endpoint: Option<String>,
    #[arg(long)]
    pub s3_bucket: Option<String>,
    #[arg(long, default_value = "us-east-1")]
    pub s3_region: String,

    /// Tenants, each with one simulated xAgent backend (one WebSocket).
    #[arg(long, default_value_t = 4)]
    pub tenants: usize,
    /// Channels in total, spread evenly across tenants, each bound to the fake target.
    #[arg(long, default_value_t = 200)]
    pub channels: usize,
    /// How long load is offered (500ms, 30s, 2m).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub duration: Duration,
    /// How long to wait after the run for accepted work to be delivered before it counts as lost.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub settle: Duration,
    /// Inbound webhook messages per second in total; 0 = as fast as `--concurrency` allows.
    #[arg(long, default_value_t = 200.0)]
    pub inbound_rate: f64,
    /// In-flight inbound POSTs at most.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// `webhook_message_send` tool calls per second in total; 0 = off.
    #[arg(long, default_value_t = 20.0)]
    pub tool_rate: f64,
    /// xAgent `chat.message` (outbound to the target) per second in total; 0 = off.
    #[arg(long, default_value_t = 20.0)]
    pub outbound_rate: f64,
    /// Upload + `webhook_file_send` operations per second in total; 0 = off. Skipped in cluster
    /// mode without S3 (the pods would not share files).
    #[arg(long, default_value_t = 1.0)]
    pub file_rate: f64,
    /// Size of each uploaded file.
    #[arg(long, default_value_t = 16 * 1024)]
    pub file_bytes: usize,
    /// Bytes of filler text added to every message.
    #[arg(long, default_value_t = 64)]
    pub text_bytes: usize,

    /// Simulated agent hosts (Connector API v1), each with one xAgent `device.agent-host`
    /// channel bound to it; 0 = no host workload. Works with both modes.
    #[arg(long, default_value_t = 0)]
    pub hosts: usize,
    /// `agent_run_start` calls per second in total, round robin over the hosts.
    #[arg(long, default_value_t = 10.0)]
    pub run_rate: f64,
    /// `run_event`s a host streams per run (progress events; the last is the completion).
    #[arg(long, default_value_t = 20)]
    pub events_per_run: u64,
    /// Time between two events of a run at the host (0ms: all at once), so runs last
    /// (events-per-run - 1) x this.
    #[arg(long, default_value = "0ms", value_parser = parse_duration)]
    pub event_interval: Duration,
    /// Leave the chat workload out (no im.webhook backends, channels or flows), so that
    /// `--hosts` is measured alone.
    #[arg(long)]
    pub no_chat: bool,

    /// Cluster: SIGKILL one pod this long after the load starts (embedded: kill and restart
    /// the only pod on the same data directory).
    #[arg(long, value_parser = parse_duration)]
    pub kill_pod_at: Option<Duration>,
    /// SIGTERM each original pod in turn (from a quarter of the run on), starting a
    /// replacement before moving to the next.
    #[arg(long)]
    pub rolling_restart: bool,

    /// Before the workload, measure what the store can do in the same run: a 16-connection
    /// single-row INSERT loop on `--postgres-url` (5 s, in the run's schema) and the SQLite
    /// commit rate (WAL, synchronous=FULL, one row per transaction, 3 s) next to the pods'
    /// data; the delivered inbound rate is printed as a ratio of them.
    #[arg(long)]
    pub baseline: bool,
    /// Idle-socket mode instead of the message workload: open this many xAgent sockets
    /// (connect + hello) in 10 steps, measuring the pods' RSS per socket and the connect rate.
    #[arg(long, default_value_t = 0)]
    pub idle_sockets: usize,
    /// Idle-socket mode: `channel.open`s per socket, in a second phase of 10 steps (RSS per
    /// channel, open rate per step); 0 = sockets only.
    #[arg(long, default_value_t = 0)]
    pub channels_per_socket: usize,
    /// Idle-socket mode with `--kill-pod-at` or `--rolling-restart`: `channel.open`s a moved
    /// socket keeps in flight while it reopens its channels (as an xAgent backend pipelines
    /// them).
    #[arg(long, default_value_t = crate::idle::REOPEN_PER_SOCKET)]
    pub reopen_in_flight: usize,
    /// Before the workload, compare `ping` round trips/s on the pod's /ws with a bare
    /// tokio-tungstenite server (a child process of the loadtest), driven by the same client.
    #[arg(long)]
    pub ping_compare: bool,
    /// Sockets of `--ping-compare`, each with one ping in flight.
    #[arg(long, default_value_t = 4)]
    pub ping_sockets: usize,
    /// How long each side of `--ping-compare` runs.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub ping_duration: Duration,

    /// Machine-readable report.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Keep pod data and logs in this directory instead of a removed temporary one.
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    /// `SWITCHYARD_LOG__LEVEL` of the pods.
    #[arg(long, default_value = "warn")]
    pub pod_log_level: String,
    /// Extra pod setting, repeatable: `--pod-env SWITCHYARD_DELIVERY__WINDOW=32`.
    #[arg(long = "pod-env", value_parser = parse_env_pair)]
    pub pod_env: Vec<(String, String)>,

    /// Run every chat flow against an existing deployment (its public base URL, for example
    /// `http://switchyard.example:8080`) instead of starting pods.
    #[arg(long)]
    pub target: Option<String>,
    /// `--target`: a tenant's API key, repeatable; the `--tenants` simulated xAgent backends
    /// (one WebSocket each) take them in turn.
    #[arg(
        long = "api-key",
        env = "SWITCHYARD_LOADTEST_API_KEY",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub api_keys: Vec<String>,
    /// Where the fake webhook target listens (default 127.0.0.1 on a free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub webhook_listen: String,
    /// The fake webhook target's base URL as the deployment reaches it (default
    /// `http://<--webhook-listen address>`); channels are bound to `<this>/hook/<n>`.
    #[arg(long)]
    pub webhook_public_url: Option<String>,
    /// `--target`: a pod's internal listener (`/metrics`, `/livez`, `/readyz`), repeatable;
    /// scraped every second when reachable.
    #[arg(long = "metrics-url")]
    pub metrics_urls: Vec<String>,
    /// `--target`: the pid of a pod on this machine, repeatable, for CPU and RSS from /proc.
    #[arg(long = "pod-pid")]
    pub pod_pids: Vec<u32>,

    /// Stages of the inbound rate: `FROM:TO:DURATION` ramps or `RATE:DURATION` steady parts,
    /// comma separated (`0:1000/s:60s,1000/s:1000/s:300s`). The load lasts as long as the
    /// stages (plus `--soak`); the tool, outbound and file flows follow the same shape with
    /// their own rate at its peak.
    #[arg(long, value_parser = crate::stages::parse_ramp)]
    pub ramp: Option<Profile>,
    /// Hold the last rate of `--ramp` (or the fixed rates without one) this long: a soak run.
    #[arg(long, value_parser = parse_duration)]
    pub soak: Option<Duration>,
    /// Threshold: every flow's end-to-end p99 at most this (exit status 4 when breached).
    #[arg(long, value_parser = parse_duration)]
    pub max_p99: Option<Duration>,
    /// Threshold: accepted but never delivered messages, all flows together, at most this.
    #[arg(long)]
    pub max_lost: Option<u64>,
    /// Threshold: message_ids delivered more than once, all flows together, at most this.
    #[arg(long)]
    pub max_dup: Option<u64>,
    /// Threshold: distinct deliveries per second, all flows together over the load time, at
    /// least this.
    #[arg(long)]
    pub min_rate: Option<f64>,
    /// The HTML report (self-contained, SVG plots); default beside `--json` with `.html`.
    #[arg(long)]
    pub html: Option<PathBuf>,
    /// No live progress line on stderr even on a terminal.
    #[arg(long)]
    pub no_progress: bool,
}

impl Args {
    pub fn validate(&self) -> Result<(), String> {
        if let Some(t) = &self.target {
            if !(t.starts_with("http://") || t.starts_with("https://")) {
                return Err(format!("--target {t:?} must be an http:// or https:// URL"));
            }
            if self.api_keys.is_empty() {
                return Err(
                    "--target needs --api-key (or SWITCHYARD_LOADTEST_API_KEY): a tenant's API key"
                        .into(),
                );
            }
            if self.api_keys.iter().any(|k| k.trim().is_empty()) {
                return Err("--api-key must not be empty".into());
            }
            if self.mode == Mode::Cluster
                || self.hosts > 0
                || self.no_chat
                || self.kill_pod_at.is_some()
                || self.rolling_restart
                || self.baseline
                || self.idle_sockets > 0
                || self.ping_compare
                || self.bin.is_some()
            {
                return Err("--target runs the chat flows only; it does not combine with --mode cluster, --bin, --hosts, --no-chat, --kill-pod-at, --rolling-restart, --baseline, --idle-sockets or --ping-compare".into());
            }
            if self.channels < self.api_keys.len() {
                return Err("--channels must be at least the number of --api-key".into());
            }
        } else if !self.metrics_urls.is_empty() || !self.pod_pids.is_empty() {
            return Err(
                "--metrics-url and --pod-pid need --target (started pods are measured anyway)"
                    .into(),
            );
        }
        for u in self
            .metrics_urls
            .iter()
            .chain(self.webhook_public_url.iter())
        {
            if !(u.starts_with("http://") || u.starts_with("https://")) {
                return Err(format!("{u:?} must be an http:// or https:// URL"));
            }
        }
        if self.webhook_listen.parse::<std::net::SocketAddr>().is_err() {
            return Err(format!(
                "--webhook-listen {:?} is not an address such as 0.0.0.0:9000",
                self.webhook_listen
            ));
        }
        if self.ramp.is_some() && self.idle_sockets > 0 {
            return Err("--ramp does not combine with --idle-sockets".into());
        }
        if self.soak.is_some_and(|d| d.is_zero()) {
            return Err("--soak must be positive".into());
        }
        if self.min_rate.is_some_and(|r| !r.is_finite() || r < 0.0) {
            return Err("--min-rate must be a number of messages per second".into());
        }
        if self.tenants == 0 || self.channels < self.tenants {
            return Err("--channels must be at least --tenants, and --tenants at least 1".into());
        }
        if self.mode == Mode::Cluster && self.pods == 0 {
            return Err("--pods must be at least 1".into());
        }
        if self.concurrency == 0 {
            return Err("--concurrency must be at least 1".into());
        }
        for r in [
            self.inbound_rate,
            self.tool_rate,
            self.outbound_rate,
            self.file_rate,
        ] {
            if !r.is_finite() || r < 0.0 {
                return Err("rates must be finite and not negative".into());
            }
        }
        if self.no_chat && self.hosts == 0 {
            return Err("--no-chat leaves nothing to do without --hosts".into());
        }
        if self.hosts > 0 {
            if !self.run_rate.is_finite() || self.run_rate <= 0.0 {
                return Err("--run-rate must be a positive number".into());
            }
            if self.events_per_run == 0 || self.events_per_run > 100_000 {
                return Err("--events-per-run must be within 1..=100000".into());
            }
        }
        if self.s3_endpoint.is_some() && self.s3_bucket.is_none() {
            return Err("--s3-endpoint needs --s3-bucket".into());
        }
        if self.kill_pod_at.is_some_and(|k| k >= self.duration) {
            return Err("--kill-pod-at must fall inside --duration".into());
        }
        if self.idle_sockets > 0 {
            if self.hosts > 0 || self.no_chat || self.rolling_restart {
                return Err(
                    "--idle-sockets does not combine with --hosts, --no-chat or --rolling-restart"
                        .into(),
                );
            }
            if self.idle_sockets < self.tenants {
                return Err("--idle-sockets must be at least --tenants".into());
            }
        } else if self.channels_per_socket > 0 {
            return Err("--channels-per-socket needs --idle-sockets".into());
        }
        if self.ping_compare && (self.ping_sockets == 0 || self.ping_duration.is_zero()) {
            return Err("--ping-sockets and --ping-duration must be positive".into());
        }
        if self.mode == Mode::Cluster && self.pods < 2 && self.kill_pod_at.is_some() {
            return Err("--kill-pod-at in cluster mode needs --pods 2 or more".into());
        }
        Ok(())
    }

    /// The rate profile of the inbound flow, or `None` for "as fast as `--concurrency`
    /// allows" (`--inbound-rate 0` without `--ramp`).
    pub fn inbound_profile(&self) -> Option<Profile> {
        let base = match &self.ramp {
            Some(r) => r.clone(),
            None if self.inbound_rate > 0.0 => Profile::constant(self.inbound_rate, self.duration),
            None => return None,
        };
        Some(match (self.ramp.is_some(), self.soak) {
            (true, Some(s)) => base.with_soak(s),
            _ => base,
        })
    }

    /// A socket flow's profile at `rate` (its rate at the ramp's peak); `None` = off.
    pub fn flow_profile(&self, rate: f64) -> Option<Profile> {
        if rate <= 0.0 {
            return None;
        }
        match self.inbound_profile().filter(|_| self.ramp.is_some()) {
            Some(p) => Some(p.scaled(rate / p.peak())),
            None => Some(Profile::constant(rate, self.duration)),
        }
    }

    /// After parsing: with `--ramp` (and `--soak`) the load lasts as long as its stages;
    /// `--soak` alone is the length of a steady run. With `--target` there is one tenant
    /// (one simulated backend) per `--api-key`.
    pub fn normalize(&mut self) {
        if self.target.is_some() && self.tenants < self.api_keys.len() {
            self.tenants = self.api_keys.len();
        }
        if let Some(r) = &self.ramp {
            let mut total = r.total();
            if let Some(s) = self.soak {
                total += s;
            }
            self.duration = total;
        } else if let Some(s) = self.soak {
            self.duration = s;
        }
    }

    pub fn target_mode(&self) -> bool {
        self.target.is_some()
    }

    pub fn pod_count(&self) -> usize {
        if self.target_mode() {
            return self.metrics_urls.len().max(self.pod_pids.len()).max(1);
        }
        match self.mode {
            Mode::Embedded => 1,
            Mode::Cluster => self.pods,
        }
    }
}

/// `500ms`, `30s`, `5m`, `1h`, or a bare number of seconds (the pods' own syntax).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("invalid duration {s:?}; use 500ms, 30s, 5m or 1h"))?;
    match unit {
        "" | "s" => Ok(Duration::from_secs(n)),
        "ms" => Ok(Duration::from_millis(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        "h" => Ok(Duration::from_secs(n * 3600)),
        _ => Err(format!("invalid duration {s:?}; use 500ms, 30s, 5m or 1h")),
    }
}

fn parse_env_pair(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if k.starts_with("SWITCHYARD_") => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("{s:?} is not SWITCHYARD_KEY=VALUE")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        assert!(parse_duration("1x").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn defaults_parse_and_validate() {
        let a = Args::parse_from(["switchyard-loadtest"]);
        assert_eq!(a.mode, Mode::Embedded);
        assert_eq!(a.tenants, 4);
        assert_eq!(a.channels, 200);
        assert_eq!(a.duration, Duration::from_secs(30));
        assert!(a.validate().is_ok());
        let bad = Args::parse_from(["switchyard-loadtest", "--channels", "2"]);
        assert!(bad.validate().is_err());
        let env = Args::parse_from([
            "switchyard-loadtest",
            "--pod-env",
            "SWITCHYARD_DELIVERY__WINDOW=32",
        ]);
        assert_eq!(env.pod_env[0].1, "32");
    }

    #[test]
    fn host_options() {
        let a = Args::parse_from(["switchyard-loadtest"]);
        assert_eq!((a.hosts, a.no_chat), (0, false));
        let h = Args::parse_from([
            "switchyard-loadtest",
            "--hosts",
            "4",
            "--run-rate",
            "20",
            "--events-per-run",
            "50",
            "--no-chat",
        ]);
        assert_eq!((h.hosts, h.events_per_run), (4, 50));
        assert!(h.validate().is_ok());
        let alone = Args::parse_from(["switchyard-loadtest", "--no-chat"]);
        assert!(alone.validate().is_err());
        let zero = Args::parse_from(["switchyard-loadtest", "--hosts", "2", "--run-rate", "0"]);
        assert!(zero.validate().is_err());
        let kill = Args::parse_from(["switchyard-loadtest", "--hosts", "2", "--kill-pod-at", "5s"]);
        assert!(kill.validate().is_ok());
    }

    fn parsed(argv: &[&str]) -> Args {
        let mut a =
            Args::parse_from(std::iter::once("switchyard-loadtest").chain(argv.iter().copied()));
        a.normalize();
        a
    }

    #[test]
    fn target_mode_options() {
        let a = parsed(&[
            "--target",
            "http://sy.example:8080/",
            "--api-key",
            "sy_a,sy_b",
            "--metrics-url",
            "http://10.0.0.1:9090",
            "--metrics-url",
            "http://10.0.0.2:9090",
            "--webhook-listen",
            "0.0.0.0:9000",
            "--webhook-public-url",
            "http://loadtest.example:9000",
        ]);
        assert!(a.validate().is_ok(), "{:?}", a.validate());
        assert_eq!(a.tenants, 4, "--tenants backends share the keys");
        assert_eq!(a.pod_count(), 2);
        let few = parsed(&[
            "--target",
            "http://x:1",
            "--api-key",
            "a,b,c",
            "--tenants",
            "1",
        ]);
        assert_eq!(few.tenants, 3, "at least one backend per key");
        let no_key = parsed(&["--target", "http://x:1"]);
        // The key may come from SWITCHYARD_LOADTEST_API_KEY in the environment of the test.
        if std::env::var_os("SWITCHYARD_LOADTEST_API_KEY").is_none() {
            assert!(no_key.validate().unwrap_err().contains("--api-key"));
        }
        for bad in [
            &["--target", "x:1", "--api-key", "k"][..],
            &[
                "--target",
                "http://x:1",
                "--api-key",
                "k",
                "--kill-pod-at",
                "5s",
            ],
            &["--target", "http://x:1", "--api-key", "k", "--hosts", "2"],
            &[
                "--target",
                "http://x:1",
                "--api-key",
                "k",
                "--mode",
                "cluster",
            ],
            &[
                "--target",
                "http://x:1",
                "--api-key",
                "k",
                "--webhook-listen",
                "nope",
            ],
            &["--metrics-url", "http://x:1"],
            &["--pod-pid", "42"],
        ] {
            assert!(parsed(bad).validate().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn stages_and_thresholds() {
        let a = parsed(&[
            "--ramp",
            "0:100/s:10s,100/s:100/s:20s",
            "--soak",
            "30s",
            "--tool-rate",
            "10",
            "--max-p99",
            "250ms",
            "--max-lost",
            "0",
            "--min-rate",
            "50",
        ]);
        assert!(a.validate().is_ok());
        assert_eq!(a.duration, Duration::from_secs(60), "stages + soak");
        let inbound = a.inbound_profile().unwrap();
        assert_eq!(inbound.stages.len(), 3);
        assert_eq!(inbound.expected_ops(), 500.0 + 2000.0 + 3000.0);
        // The tool flow has the same shape with 10/s at the peak.
        let tool = a.flow_profile(10.0).unwrap();
        assert_eq!(tool.peak(), 10.0);
        assert_eq!(tool.expected_ops(), 550.0);
        assert_eq!(a.flow_profile(0.0), None);
        assert_eq!(a.max_p99, Some(Duration::from_millis(250)));
        // Without a ramp: fixed rates; --soak alone is the run's length.
        let s = parsed(&["--soak", "2m"]);
        assert_eq!(s.duration, Duration::from_secs(120));
        assert_eq!(s.inbound_profile().unwrap().expected_ops(), 200.0 * 120.0);
        let unlimited = parsed(&["--inbound-rate", "0"]);
        assert_eq!(unlimited.inbound_profile(), None);
        assert!(parsed(&["--min-rate=-1"]).validate().is_err());
    }

    #[test]
    fn figure_options() {
        let a = Args::parse_from([
            "switchyard-loadtest",
            "--mode",
            "cluster",
            "--idle-sockets",
            "300",
            "--channels-per-socket",
            "300",
            "--kill-pod-at",
            "20s",
            "--baseline",
            "--ping-compare",
        ]);
        assert_eq!((a.idle_sockets, a.channels_per_socket), (300, 300));
        assert!(a.baseline && a.ping_compare);
        assert_eq!(a.ping_sockets, 4);
        assert!(a.validate().is_ok());
        let k0 = Args::parse_from(["switchyard-loadtest", "--idle-sockets", "10"]);
        assert_eq!(k0.channels_per_socket, 0);
        assert!(k0.validate().is_ok());
        let no_sockets = Args::parse_from(["switchyard-loadtest", "--channels-per-socket", "3"]);
        assert!(no_sockets.validate().is_err());
        let rolling = Args::parse_from([
            "switchyard-loadtest",
            "--idle-sockets",
            "10",
            "--rolling-restart",
        ]);
        assert!(rolling.validate().is_err());
    }
}
