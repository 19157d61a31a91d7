//! One typed configuration: defaults -> optional TOML file (`--config` or `SWITCHYARD_CONFIG`)
//! -> environment variables prefixed `SWITCHYARD_` with `__` between nested keys.

use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use switchyard_core::crypto::Secret;
use switchyard_core::engine::EngineConfig;
use switchyard_core::netguard::{Cidr, OutboundPolicy};

/// A duration written `500ms`, `30s`, `5m`, `1h` (or a bare number of seconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dur(pub Duration);

pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    let d = match unit.trim() {
        "" | "s" => Duration::from_secs(n),
        "ms" => Duration::from_millis(n),
        "m" => Duration::from_secs(n * 60),
        "h" => Duration::from_secs(n * 3600),
        "d" => Duration::from_secs(n * 86_400),
        _ => return None,
    };
    Some(d)
}

impl Dur {
    fn render(&self) -> String {
        let ms = self.0.as_millis();
        if ms > 0 && ms.is_multiple_of(3_600_000) {
            format!("{}h", ms / 3_600_000)
        } else if ms > 0 && ms.is_multiple_of(60_000) {
            format!("{}m", ms / 60_000)
        } else if ms.is_multiple_of(1000) {
            format!("{}s", ms / 1000)
        } else {
            format!("{ms}ms")
        }
    }
}

impl Serialize for Dur {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.render())
    }
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            S(String),
            N(u64),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(Dur(Duration::from_secs(n))),
            Raw::S(s) => parse_duration(&s).map(Dur).ok_or_else(|| {
                serde::de::Error::custom(format!(
                    "invalid duration {s:?}; use 500ms, 30s, 5m or 1h"
                ))
            }),
        }
    }
}

/// A comma-separated list of secrets (first signs/encrypts, all verify/decrypt).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SecretList(pub Vec<Secret>);

impl Serialize for SecretList {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Never print secrets, not even in print-default-config.
        s.serialize_str(if self.0.is_empty() { "" } else { "<redacted>" })
    }
}

impl<'de> Deserialize<'de> for SecretList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            S(String),
            L(Vec<String>),
        }
        let items = match Raw::deserialize(d)? {
            Raw::S(s) => s
                .split(',')
                .map(str::trim)
                .filter(|x| !x.is_empty())
                .map(Secret::new)
                .collect(),
            Raw::L(l) => l
                .into_iter()
                .filter(|x| !x.is_empty())
                .map(Secret::new)
                .collect(),
        };
        Ok(SecretList(items))
    }
}

/// Comma-separated address ranges (`127.0.0.0/8,::1/128`), or a TOML array of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CidrList(pub Vec<Cidr>);

impl Serialize for CidrList {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let joined: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        s.serialize_str(&joined.join(","))
    }
}

impl<'de> Deserialize<'de> for CidrList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            S(String),
            L(Vec<String>),
        }
        let items: Vec<String> = match Raw::deserialize(d)? {
            Raw::S(s) => s.split(',').map(str::to_owned).collect(),
            Raw::L(l) => l,
        };
        items
            .iter()
            .map(|x| x.trim())
            .filter(|x| !x.is_empty())
            .map(|x| x.parse::<Cidr>().map_err(serde::de::Error::custom))
            .collect::<Result<_, _>>()
            .map(CidrList)
    }
}

/// What unauthenticated callers of provider ingress (webhooks) may make a pod hold
/// (`[ingress]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IngressConfig {
    /// Largest JSON webhook body (generic webhook, Telegram updates), held until verified.
    pub max_json_bytes: u64,
    /// Time allowed to receive a webhook body.
    pub body_timeout: Dur,
    /// Webhook requests in flight per pod and provider; more get 503 with Retry-After.
    pub max_concurrent: usize,
    /// Generic webhook requests in flight per channel; more get 429 with Retry-After.
    pub max_concurrent_per_channel: usize,
    /// Largest body of the other routes that read one before authenticating (host
    /// enrollment and token, operator decisions).
    pub max_preauth_bytes: u64,
}

impl Default for IngressConfig {
    fn default() -> Self {
        Self {
            max_json_bytes: 1024 * 1024,
            body_timeout: Dur(Duration::from_secs(30)),
            max_concurrent: 64,
            max_concurrent_per_channel: 8,
            max_preauth_bytes: 64 * 1024,
        }
    }
}

/// Requests to URLs a tenant supplied (`[outbound]`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OutboundConfig {
    /// Internal address ranges (loopback, private, link-local, ...) that tenant-supplied URLs
    /// may reach anyway; empty = none.
    pub allow_private: CidrList,
}

impl OutboundConfig {
    pub fn policy(&self) -> OutboundPolicy {
        OutboundPolicy::new(self.allow_private.0.clone())
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct S3Config {
    pub endpoint: Option<String>,
    pub bucket: Option<String>,
    pub region: String,
    pub force_path_style: bool,
}

impl Default for S3Config {
    fn default() -> Self {
        Self {
            endpoint: None,
            bucket: None,
            region: "us-east-1".into(),
            force_path_style: false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LeaseConfig {
    pub connector_grace: Dur,
    pub presence_interval: Dur,
    pub presence_ttl: Dur,
    pub janitor_interval: Dur,
    pub janitor_lease_ttl: Dur,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        Self {
            connector_grace: Dur(Duration::from_secs(3600)),
            presence_interval: Dur(Duration::from_secs(2)),
            presence_ttl: Dur(Duration::from_secs(10)),
            janitor_interval: Dur(Duration::from_secs(5)),
            janitor_lease_ttl: Dur(Duration::from_secs(15)),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeliveryConfig {
    pub message_ttl: Dur,
    pub outbox_cap: u32,
    pub ack_timeout: Dur,
    pub window: u32,
    pub dedupe_window: Dur,
    pub sweep_interval: Dur,
    pub retry_pause: Dur,
    pub committers: usize,
    pub commit_batch: usize,
    pub commit_backlog: usize,
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        let e = EngineConfig::default();
        Self {
            message_ttl: Dur(e.message_ttl),
            outbox_cap: e.outbox_cap,
            ack_timeout: Dur(e.ack_timeout),
            window: e.delivery_window,
            dedupe_window: Dur(e.dedupe_window),
            sweep_interval: Dur(Duration::from_secs(5)),
            retry_pause: Dur(Duration::from_secs(2)),
            committers: 0,
            commit_batch: 256,
            commit_backlog: 4096,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    pub max_frame_bytes: usize,
    pub max_upload_bytes: u64,
    pub max_inbound_bytes: u64,
    pub tools_per_socket: usize,
    pub tool_timeout: Dur,
    pub socket_send_queue: usize,
    pub channel_queue: usize,
    pub ws_read_buffer_bytes: usize,
    pub opens_per_socket: usize,
    pub socket_send_queue_bytes: usize,
    pub socket_stall: Dur,
    pub hello_timeout: Dur,
    /// Public-listener connections still speaking HTTP (not upgraded) at once; more are
    /// answered 503 `overloaded` and closed.
    pub max_connections: usize,
    /// Time for a request's headers to arrive (and for an idle keep-alive connection to
    /// start its next request) before the connection is closed.
    pub header_read_timeout: Dur,
    /// WebSocket ping interval on xAgent sockets; a socket from which nothing (not even a
    /// pong) arrived for two intervals is closed with 1008. 0s = off.
    pub ws_ping_interval: Dur,
    /// auth.* requests in flight per socket; more are answered `busy`.
    pub auth_per_socket: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        let e = EngineConfig::default();
        Self {
            max_frame_bytes: 1024 * 1024,
            max_upload_bytes: e.max_upload_bytes,
            max_inbound_bytes: 20 * 1024 * 1024,
            tools_per_socket: 32,
            tool_timeout: Dur(e.tool_timeout),
            socket_send_queue: 512,
            channel_queue: 64,
            ws_read_buffer_bytes: 4096,
            opens_per_socket: 32,
            socket_send_queue_bytes: 8 * 1024 * 1024,
            socket_stall: Dur(Duration::from_secs(10)),
            hello_timeout: Dur(Duration::from_secs(10)),
            max_connections: 10_000,
            header_read_timeout: Dur(Duration::from_secs(10)),
            ws_ping_interval: Dur(Duration::from_secs(30)),
            auth_per_socket: 8,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionConfig {
    pub auth_session_ttl: Dur,
    pub idempotency_ttl: Dur,
    pub file_ttl: Dur,
    pub download_url_ttl: Dur,
    pub delta_ttl: Dur,
    pub delta_max_bytes: usize,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        let e = EngineConfig::default();
        Self {
            auth_session_ttl: Dur(e.auth_session_ttl),
            idempotency_ttl: Dur(e.idempotency_ttl),
            file_ttl: Dur(e.file_ttl),
            download_url_ttl: Dur(e.download_url_ttl),
            delta_ttl: Dur(e.delta_ttl),
            delta_max_bytes: e.delta_max_bytes,
        }
    }
}

/// Per-tenant quotas (`[quotas]`): the defaults every tenant gets unless the operator set
/// its own (`switchyard tenant quota`). 0 = unlimited.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QuotasConfig {
    /// Live xAgent sockets per tenant, cluster-wide.
    pub sockets: u64,
    /// Channels per tenant, cluster-wide.
    pub channels: u64,
    /// Bytes of unexpired files per tenant; uploads are refused once reached.
    pub stored_bytes: u64,
    /// Work requests (channel.open, auth.*, tool.invoke, chat.message, descriptor.get)
    /// per tenant per second on each pod, with bursts of twice that.
    pub requests_per_second: u64,
    /// How often each pod reloads the per-tenant overrides from the store.
    pub refresh_interval: Dur,
}

impl Default for QuotasConfig {
    fn default() -> Self {
        Self {
            sockets: 0,
            channels: 0,
            stored_bytes: 0,
            requests_per_second: 1000,
            refresh_interval: Dur(Duration::from_secs(10)),
        }
    }
}

impl QuotasConfig {
    pub fn values(&self) -> switchyard_core::quota::QuotaValues {
        switchyard_core::quota::QuotaValues {
            sockets: self.sockets,
            channels: self.channels,
            stored_bytes: self.stored_bytes,
            requests_per_second: self.requests_per_second,
        }
    }
}

/// Readiness with hysteresis (`[readiness]`): the pod checks its shared backends itself
/// and reports not ready only after a backend failed `failure_threshold` checks in a row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReadinessConfig {
    /// How often the store, bus and ephemeral state are checked.
    pub interval: Dur,
    /// Consecutive failed checks of one backend before `/readyz` answers 503.
    pub failure_threshold: u32,
    /// How long one check may take before it counts as failed.
    pub timeout: Dur,
}

impl Default for ReadinessConfig {
    fn default() -> Self {
        Self {
            interval: Dur(Duration::from_secs(2)),
            failure_threshold: 5,
            timeout: Dur(Duration::from_secs(2)),
        }
    }
}

/// Connector API v1: agent hosts and their gateway (`[hosts]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HostsSection {
    /// The seed's timeouts table, each configurable.
    pub register_timeout: Dur,
    pub heartbeat_response: Dur,
    pub create_run_accept: Dur,
    pub event_delivery: Dur,
    pub cancel_confirm: Dur,
    pub upload_url_ttl: Dur,
    pub download_url_ttl: Dur,
    pub keepalive: Dur,
    pub heartbeat_interval: Dur,
    pub host_lost_after: Dur,
    /// `requeue` or `fail`: what happens to the runs of a lost host.
    pub lost_policy: switchyard_protocol::hosts::HostLostPolicy,
    pub enrollment_ttl: Dur,
    pub approval_ttl: Dur,
    pub run_retention: Dur,
    pub max_active_runs_per_tenant: usize,
    pub max_artifact_bytes: u64,
    pub jwt_ttl: Dur,
    pub cert_valid_days: u32,
    /// Extra names (DNS or IP) in the mTLS listener's certificate.
    pub tls_names: Vec<String>,
    /// How often a host connection re-checks its work without a doorbell.
    pub tick: Dur,
}

impl Default for HostsSection {
    fn default() -> Self {
        let t = switchyard_protocol::hosts::Timeouts::default();
        let c = switchyard_core::hosts::HostsConfig::default();
        Self {
            register_timeout: Dur(t.register),
            heartbeat_response: Dur(t.heartbeat_response),
            create_run_accept: Dur(t.create_run_accept),
            event_delivery: Dur(t.event_delivery),
            cancel_confirm: Dur(t.cancel_confirm),
            upload_url_ttl: Dur(t.upload_url_ttl),
            download_url_ttl: Dur(t.download_url_ttl),
            keepalive: Dur(t.keepalive),
            heartbeat_interval: Dur(t.heartbeat_interval),
            host_lost_after: Dur(t.host_lost_after),
            lost_policy: switchyard_protocol::hosts::HostLostPolicy::Requeue,
            enrollment_ttl: Dur(c.enrollment_ttl),
            approval_ttl: Dur(c.approval_ttl),
            run_retention: Dur(c.run_retention),
            max_active_runs_per_tenant: c.max_active_runs_per_tenant,
            max_artifact_bytes: c.max_artifact_bytes,
            jwt_ttl: Dur(Duration::from_secs(600)),
            cert_valid_days: 365,
            tls_names: vec![],
            tick: Dur(c.tick),
        }
    }
}

impl HostsSection {
    pub fn core(&self) -> switchyard_core::hosts::HostsConfig {
        use switchyard_protocol::hosts::Timeouts;
        switchyard_core::hosts::HostsConfig {
            timeouts: Timeouts {
                register: self.register_timeout.0,
                heartbeat_response: self.heartbeat_response.0,
                create_run_accept: self.create_run_accept.0,
                event_delivery: self.event_delivery.0,
                cancel_confirm: self.cancel_confirm.0,
                upload_url_ttl: self.upload_url_ttl.0,
                download_url_ttl: self.download_url_ttl.0,
                keepalive: self.keepalive.0,
                heartbeat_interval: self.heartbeat_interval.0,
                host_lost_after: self.host_lost_after.0,
            },
            lost_policy: self.lost_policy,
            enrollment_ttl: self.enrollment_ttl.0,
            approval_ttl: self.approval_ttl.0,
            run_retention: self.run_retention.0,
            max_active_runs_per_tenant: self.max_active_runs_per_tenant,
            max_artifact_bytes: self.max_artifact_bytes,
            device_card_id: switchyard_protocol::hosts::AGENT_HOST_CARD_ID.into(),
            tick: self.tick.0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelegramConfig {
    pub api_base: String,
    /// How updates arrive; anything else is refused at load, naming the allowed values.
    pub mode: TelegramMode,
}

impl Default for TelegramConfig {
    fn default() -> Self {
        Self {
            api_base: "https://api.telegram.org".into(),
            mode: TelegramMode::Auto,
        }
    }
}

/// `telegram.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TelegramMode {
    /// Webhook when public_base_url is https, else long polling.
    Auto,
    Webhook,
    Polling,
}

impl TelegramMode {
    pub fn provider(self) -> switchyard_provider_telegram::Mode {
        match self {
            Self::Auto => switchyard_provider_telegram::Mode::Auto,
            Self::Webhook => switchyard_provider_telegram::Mode::Webhook,
            Self::Polling => switchyard_provider_telegram::Mode::Polling,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WechatConfig {
    /// iLink bot API root (`{api_base}/ilink/bot/...`).
    pub api_base: String,
    /// Media CDN root (`{cdn_base}/upload`, `{cdn_base}/download`).
    pub cdn_base: String,
    /// Lifetime of a bot's poller lease (renewed every third of it): how long a dead pod's
    /// bots wait before another pod polls them.
    pub poll_lease_ttl: Dur,
    /// How often a pod that does not hold a bot's lease tries to take it.
    pub lease_retry: Dur,
}

impl Default for WechatConfig {
    fn default() -> Self {
        Self {
            api_base: "https://ilinkai.weixin.qq.com".into(),
            cdn_base: "https://novac2c.cdn.weixin.qq.com/c2c".into(),
            poll_lease_ttl: Dur(Duration::from_secs(15)),
            lease_retry: Dur(Duration::from_secs(2)),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FeishuConfig {
    /// Feishu Open Platform root (`{base}/open-apis/...`, the long-connection endpoint).
    pub api_base: String,
    /// The same for Lark (international) apps.
    pub lark_api_base: String,
    /// Feishu accounts host, for the one-click app registration of the QR flow
    /// (`{base}/oauth/v1/app/registration`).
    pub accounts_base: String,
    /// The same for Lark tenants.
    pub lark_accounts_base: String,
    /// Lifetime of an app's long-connection lease: how soon another pod takes over after
    /// the holder dies.
    pub lease_ttl: Dur,
    /// Longest an answer's turn keeps its reply target (the chat it started in) without a
    /// final or `idle`; an abandoned turn cannot pin the channel's answers to one chat longer.
    pub turn_ttl: Dur,
}

impl Default for FeishuConfig {
    fn default() -> Self {
        Self {
            api_base: "https://open.feishu.cn".into(),
            lark_api_base: "https://open.larksuite.com".into(),
            accounts_base: "https://accounts.feishu.cn".into(),
            lark_accounts_base: "https://accounts.larksuite.com".into(),
            lease_ttl: Dur(Duration::from_secs(30)),
            turn_ttl: Dur(Duration::from_secs(600)),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    pub format: LogFormat,
    /// A level (`trace`, `debug`, `info`, `warn`, `error`, `off`) or a filter of
    /// `target=level` directives such as `switchyard=debug,info`; checked at load.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            level: "info".into(),
        }
    }
}

/// `log.format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

const LOG_LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];

/// A log filter is a level or `target=level` directives. tracing reads a bare word such as
/// `verbose` as a target name (that target at every level, everything else off), which
/// would start a pod that logs nothing: such a word is refused instead.
pub fn check_log_filter(filter: &str) -> Result<(), String> {
    let bad = |why: String| {
        Err(format!(
            "{why}; use one of {} or directives like `switchyard=debug,info`",
            LOG_LEVELS.join(", ")
        ))
    };
    let is_level = |l: &str| LOG_LEVELS.contains(&l.trim().to_ascii_lowercase().as_str());
    let directives: Vec<&str> = filter
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .collect();
    if directives.is_empty() {
        return bad("the log filter is empty".into());
    }
    for &d in &directives {
        match d.rsplit_once('=') {
            Some((target, level)) if !target.trim().is_empty() && is_level(level) => {}
            Some(_) => return bad(format!("`{d}` is not a `target=level` directive")),
            None if is_level(d) => {}
            None => return bad(format!("`{d}` is not a log level")),
        }
    }
    tracing_subscriber::EnvFilter::try_new(filter)
        .map(drop)
        .or_else(|e| bad(format!("`{filter}`: {e}")))
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub listen: String,
    pub metrics_listen: String,
    pub data_dir: PathBuf,
    pub database_url: Option<String>,
    pub database_schema: Option<String>,
    pub database_max_connections: u32,
    pub nats_url: Option<String>,
    pub nats_subject_prefix: String,
    pub redis_url: Option<String>,
    pub redis_key_prefix: String,
    pub s3: S3Config,
    pub pod_id: Option<String>,
    pub public_base_url: Option<String>,
    pub signing_keys: SecretList,
    pub encryption_keys: SecretList,
    pub lease: LeaseConfig,
    pub drain_timeout: Dur,
    pub delivery: DeliveryConfig,
    pub limits: LimitsConfig,
    pub ingress: IngressConfig,
    pub outbound: OutboundConfig,
    pub retention: RetentionConfig,
    pub quotas: QuotasConfig,
    pub readiness: ReadinessConfig,
    pub telegram: TelegramConfig,
    pub wechat: WechatConfig,
    pub feishu: FeishuConfig,
    pub log: LogConfig,
    /// The pods' mTLS listener for host agents; empty = off.
    pub hosts_tls_listen: String,
    /// Host CA certificate and key (PEM text or a file path). Unset: generated once and kept
    /// in the store, encrypted with the encryption key.
    pub hosts_ca_cert: Option<String>,
    pub hosts_ca_key: Option<String>,
    /// Trusted-ingress mode: header carrying the verified client certificate (URL-encoded
    /// PEM). Unset = the public listener takes no client certificates.
    pub hosts_client_cert_header: Option<String>,
    /// Proof a request came through the trusted ingress, required with
    /// `hosts_client_cert_header`: secrets (comma-separated, any one verifies) the ingress
    /// sends in `X-Switchyard-Ingress-Secret`, and/or the ingress's own address ranges.
    pub hosts_ingress_secret: SecretList,
    pub hosts_ingress_sources: CidrList,
    /// Operators of the approval API, `name=token` comma-separated. Empty = API off.
    pub operator_tokens: SecretList,
    pub hosts: HostsSection,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            metrics_listen: "127.0.0.1:9090".into(),
            data_dir: PathBuf::from("./data"),
            database_url: None,
            database_schema: None,
            database_max_connections: 16,
            nats_url: None,
            nats_subject_prefix: "switchyard".into(),
            redis_url: None,
            redis_key_prefix: "switchyard".into(),
            s3: S3Config::default(),
            pod_id: None,
            public_base_url: None,
            signing_keys: SecretList::default(),
            encryption_keys: SecretList::default(),
            lease: LeaseConfig::default(),
            drain_timeout: Dur(Duration::from_secs(30)),
            delivery: DeliveryConfig::default(),
            limits: LimitsConfig::default(),
            ingress: IngressConfig::default(),
            outbound: OutboundConfig::default(),
            retention: RetentionConfig::default(),
            quotas: QuotasConfig::default(),
            readiness: ReadinessConfig::default(),
            telegram: TelegramConfig::default(),
            wechat: WechatConfig::default(),
            feishu: FeishuConfig::default(),
            log: LogConfig::default(),
            hosts_tls_listen: "127.0.0.1:8443".into(),
            hosts_ca_cert: None,
            hosts_ca_key: None,
            hosts_client_cert_header: None,
            hosts_ingress_secret: SecretList::default(),
            hosts_ingress_sources: CidrList::default(),
            operator_tokens: SecretList::default(),
            hosts: HostsSection::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration: {0}")]
    Load(#[from] Box<figment::Error>),
    #[error("configuration: {0}")]
    Invalid(String),
}

/// Where a key's value came from: the file, or the `SWITCHYARD_*` variable.
fn key_source(fig: &Figment, path: &[String]) -> String {
    match fig.find_metadata(&path.join(".")) {
        Some(m) if m.name.contains("environment") => format!(
            "the environment variable SWITCHYARD_{}",
            path.join("__").to_ascii_uppercase()
        ),
        Some(m) => m
            .source
            .as_ref()
            .map_or_else(|| m.name.to_string(), ToString::to_string),
        None => "the configuration".into(),
    }
}

/// An unknown key, or a value that is not one of a setting's choices, names the key, where
/// it came from (the file, or the variable) and what is allowed; any other error is
/// figment's own.
fn unknown_key(fig: &Figment, e: figment::Error) -> ConfigError {
    use figment::error::Kind;
    for err in e.clone() {
        match &err.kind {
            Kind::UnknownField(field, expected) => {
                // figment's path ends with the unknown field itself.
                let mut path = err.path.clone();
                if path.last() != Some(field) {
                    path.push(field.clone());
                }
                return ConfigError::Invalid(format!(
                    "unknown key `{}` in {}; known keys there: {}",
                    path.join("."),
                    key_source(fig, &path),
                    expected.join(", ")
                ));
            }
            Kind::UnknownVariant(found, expected) => {
                return ConfigError::Invalid(format!(
                    "`{}` = {found:?} in {} is not one of: {}",
                    err.path.join("."),
                    key_source(fig, &err.path),
                    expected.join(", ")
                ));
            }
            _ => {}
        }
    }
    ConfigError::Load(Box::new(e))
}

impl Config {
    /// Defaults, then the file (if any), then `SWITCHYARD_*` environment variables.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        let mut fig = Figment::from(Serialized::defaults(Config::default()));
        let file = file
            .map(Path::to_path_buf)
            .or_else(|| std::env::var_os("SWITCHYARD_CONFIG").map(PathBuf::from));
        if let Some(f) = file {
            if !f.exists() {
                return Err(ConfigError::Invalid(format!(
                    "config file {} does not exist",
                    f.display()
                )));
            }
            fig = fig.merge(Toml::file(f));
        }
        // Unknown keys (a typo in the file or in a SWITCHYARD_* variable) are refused, naming
        // the key: every struct is deny_unknown_fields. SWITCHYARD_CONFIG names the file and
        // SWITCHYARD_LOG is the log filter override, so neither is a key; SWITCHYARD_BUILD_TIME,
        // SWITCHYARD_GIT_REV and SWITCHYARD_GIT_TAG are build metadata (the build script reads
        // the first and emits all three, which `cargo run` and `cargo test` pass on).
        fig = fig.merge(Env::prefixed("SWITCHYARD_").split("__").ignore(&[
            "config",
            "log",
            "build_time",
            "git_rev",
            "git_tag",
        ]));
        let cfg: Config = fig.extract().map_err(|e| unknown_key(&fig, e))?;
        cfg.validate()?;
        if let Some(filter) = std::env::var_os("SWITCHYARD_LOG") {
            check_log_filter(&filter.to_string_lossy())
                .map_err(|e| ConfigError::Invalid(format!("SWITCHYARD_LOG: {e}")))?;
        }
        Ok(cfg)
    }

    /// Defaults, then `toml` (no file, no environment): the config fuzz target's entry and a
    /// quick way to check a file's text.
    pub fn from_toml_str(toml: &str) -> Result<Self, ConfigError> {
        let fig = Figment::from(Serialized::defaults(Config::default())).merge(Toml::string(toml));
        let cfg: Config = fig.extract().map_err(|e| unknown_key(&fig, e))?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(u) = &self.public_base_url {
            let parsed = url::Url::parse(u).map_err(|_| {
                ConfigError::Invalid("public_base_url must be an absolute URL".into())
            })?;
            if !matches!(parsed.scheme(), "http" | "https") {
                return Err(ConfigError::Invalid(
                    "public_base_url must be http or https".into(),
                ));
            }
        }
        if let Some(db) = &self.database_url
            && !(db.starts_with("sqlite:")
                || db.starts_with("postgres://")
                || db.starts_with("postgresql://"))
        {
            return Err(ConfigError::Invalid(
                "database_url must start with sqlite: or postgres://".into(),
            ));
        }
        check_log_filter(&self.log.level)
            .map_err(|e| ConfigError::Invalid(format!("log.level: {e}")))?;
        for (name, v) in [
            ("wechat.api_base", &self.wechat.api_base),
            ("wechat.cdn_base", &self.wechat.cdn_base),
            ("feishu.accounts_base", &self.feishu.accounts_base),
            ("feishu.lark_accounts_base", &self.feishu.lark_accounts_base),
        ] {
            if !url::Url::parse(v).is_ok_and(|u| matches!(u.scheme(), "http" | "https")) {
                return Err(ConfigError::Invalid(format!(
                    "{name} must be an http(s) URL"
                )));
            }
        }
        if let Err(e) = self.hosts.core().timeouts.validate() {
            return Err(ConfigError::Invalid(format!("hosts: {e}")));
        }
        if self.hosts_ca_cert.is_some() != self.hosts_ca_key.is_some() {
            return Err(ConfigError::Invalid(
                "hosts_ca_cert and hosts_ca_key are set together".into(),
            ));
        }
        if self.hosts_client_cert_header.is_some() {
            let secrets = &self.hosts_ingress_secret.0;
            if secrets.is_empty() && self.hosts_ingress_sources.0.is_empty() {
                return Err(ConfigError::Invalid(
                    "hosts_client_cert_header needs proof that requests came through the ingress: set hosts_ingress_secret (sent by the ingress in X-Switchyard-Ingress-Secret) or hosts_ingress_sources (the ingress's address ranges)".into(),
                ));
            }
            if secrets
                .iter()
                .any(|s| s.expose().trim().chars().count() < 16)
            {
                return Err(ConfigError::Invalid(
                    "hosts_ingress_secret entries must be 16+ characters".into(),
                ));
            }
        }
        for entry in &self.operator_tokens.0 {
            // Judged as used: trimmed, so a token of spaces (empty once trimmed) is refused.
            match entry.expose().split_once('=') {
                Some((name, token))
                    if !name.trim().is_empty() && token.trim().chars().count() >= 16 => {}
                _ => {
                    return Err(ConfigError::Invalid(
                        "operator_tokens entries are name=token with a token of 16+ characters"
                            .into(),
                    ));
                }
            }
        }
        if self.ingress.max_concurrent == 0
            || self.ingress.max_concurrent_per_channel == 0
            || self.ingress.max_json_bytes == 0
            || self.ingress.body_timeout.0.is_zero()
        {
            return Err(ConfigError::Invalid(
                "ingress limits must be above zero".into(),
            ));
        }
        if self.readiness.failure_threshold == 0 || self.readiness.interval.0.is_zero() {
            return Err(ConfigError::Invalid(
                "readiness.failure_threshold and readiness.interval must be above zero".into(),
            ));
        }
        if self.delivery.window == 0 || self.limits.tools_per_socket == 0 {
            return Err(ConfigError::Invalid(
                "delivery.window and limits.tools_per_socket must be at least 1".into(),
            ));
        }
        Ok(())
    }

    /// True when the store is shared by several pods (keys must then be configured).
    pub fn is_clustered(&self) -> bool {
        self.database_url
            .as_deref()
            .is_some_and(|u| u.starts_with("postgres"))
    }

    /// Operators of the approval API as (name, token).
    pub fn operators(&self) -> Vec<(String, String)> {
        self.operator_tokens
            .0
            .iter()
            .filter_map(|e| e.expose().split_once('='))
            .map(|(n, t)| (n.trim().to_owned(), t.trim().to_owned()))
            // Never an empty token, whatever reached here: it would match a missing header.
            .filter(|(n, t)| !n.is_empty() && !t.is_empty())
            .collect()
    }

    /// Group commit sizes: one committer on SQLite (one writer), four on Postgres.
    pub fn commit_limits(&self) -> switchyard_core::engine::CommitLimits {
        let committers = match self.delivery.committers {
            0 if self.is_clustered() => 4,
            0 => 1,
            n => n,
        };
        switchyard_core::engine::CommitLimits {
            committers,
            max_batch: self.delivery.commit_batch.max(1),
            max_queued: self.delivery.commit_backlog.max(1),
        }
    }

    pub fn engine(&self) -> EngineConfig {
        EngineConfig {
            connector_grace: self.lease.connector_grace.0,
            auth_session_ttl: self.retention.auth_session_ttl.0,
            message_ttl: self.delivery.message_ttl.0,
            outbox_cap: self.delivery.outbox_cap,
            dedupe_window: self.delivery.dedupe_window.0,
            ack_timeout: self.delivery.ack_timeout.0,
            delivery_window: self.delivery.window,
            idempotency_ttl: self.retention.idempotency_ttl.0,
            file_ttl: self.retention.file_ttl.0,
            download_url_ttl: self.retention.download_url_ttl.0,
            max_upload_bytes: self.limits.max_upload_bytes,
            tool_timeout: self.limits.tool_timeout.0,
            delta_ttl: self.retention.delta_ttl.0,
            delta_max_bytes: self.retention.delta_max_bytes,
        }
    }
}

/// The documented default configuration printed by `switchyard print-default-config`.
pub const DEFAULT_CONFIG_TOML: &str = include_str!("default-config.toml");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Some(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Some(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_duration("7"), Some(Duration::from_secs(7)));
        assert_eq!(parse_duration("1x"), None);
        assert_eq!(parse_duration(""), None);
    }

    #[test]
    // figment's Jail API fixes the closure's error type.
    #[allow(clippy::result_large_err)]
    fn printed_default_config_is_the_default() {
        // Parsed on its own: every key is where the structs expect it (unknown keys are
        // refused, so a key printed under the wrong table fails here).
        let parsed: Config = Figment::from(Toml::string(DEFAULT_CONFIG_TOML))
            .extract()
            .unwrap();
        assert_eq!(parsed, Config::default());
        // Loaded as a config file, the way `serve --config FILE` does.
        figment::Jail::expect_with(|jail| {
            jail.clear_env();
            jail.create_file("printed.toml", DEFAULT_CONFIG_TOML)?;
            let c = Config::load(Some(Path::new("printed.toml"))).map_err(|e| e.to_string())?;
            assert_eq!(c, Config::default());
            Ok(())
        });
        // Every top-level key that is not a table is printed before the first table, where
        // TOML puts it at the top level.
        let top = DEFAULT_CONFIG_TOML.split("\n[").next().unwrap();
        for key in [
            "hosts_tls_listen",
            "operator_tokens",
            "listen",
            "metrics_listen",
        ] {
            assert!(
                top.lines().any(|l| l.starts_with(&format!("{key} ="))),
                "{key} is printed at the top level"
            );
        }
    }

    #[test]
    #[allow(clippy::result_large_err)]
    fn unknown_keys_are_refused_naming_them() {
        figment::Jail::expect_with(|jail| {
            // Whatever SWITCHYARD_* the test runner has (scripts/test.sh exports some) would
            // be refused as unknown keys.
            jail.clear_env();
            jail.set_env("SWITCHYARD_LEASE__CONECTOR_GRACE", "2h");
            let e = Config::load(None).unwrap_err().to_string();
            assert!(
                e.contains("lease.conector_grace")
                    && e.contains("SWITCHYARD_LEASE__CONECTOR_GRACE")
                    && e.contains("connector_grace"),
                "{e}"
            );
            Ok(())
        });
        figment::Jail::expect_with(|jail| {
            jail.clear_env();
            jail.set_env("SWITCHYARD_LISTN", "0.0.0.0:1");
            let e = Config::load(None).unwrap_err().to_string();
            assert!(
                e.contains("`listn`") && e.contains("SWITCHYARD_LISTN"),
                "{e}"
            );
            Ok(())
        });
        figment::Jail::expect_with(|jail| {
            jail.clear_env();
            jail.create_file("typo.toml", "[log]\nhosts_tls_listen = \"\"\n")?;
            let e = Config::load(Some(Path::new("typo.toml")))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("log.hosts_tls_listen") && e.contains("typo.toml"),
                "{e}"
            );
            Ok(())
        });
        // The file and log-filter variables are not keys.
        figment::Jail::expect_with(|jail| {
            jail.clear_env();
            jail.set_env("SWITCHYARD_LOG", "debug");
            jail.set_env("SWITCHYARD_LOG__LEVEL", "warn");
            let c = Config::load(None).map_err(|e| e.to_string())?;
            assert_eq!(c.log.level, "warn");
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)]
    fn every_table_refuses_unknown_keys() {
        // One typo per table, through the environment: each is refused naming its variable.
        for var in [
            "SWITCHYARD_S3__BUKET",
            "SWITCHYARD_LEASE__GRACE",
            "SWITCHYARD_DELIVERY__WINDOWS",
            "SWITCHYARD_LIMITS__MAX_FRAME",
            "SWITCHYARD_INGRESS__MAX_JSON_BYTE",
            "SWITCHYARD_OUTBOUND__ALLOW_PRIVATES",
            "SWITCHYARD_RETENTION__FILES_TTL",
            "SWITCHYARD_QUOTAS__SOCKET",
            "SWITCHYARD_TELEGRAM__API",
            "SWITCHYARD_LOG__LEVELS",
            "SWITCHYARD_HOSTS__LOST",
        ] {
            figment::Jail::expect_with(|jail| {
                jail.clear_env();
                jail.set_env(var, "1");
                let e = Config::load(None).unwrap_err().to_string();
                assert!(e.contains("unknown key") && e.contains(var), "{var}: {e}");
                Ok(())
            });
        }
    }

    #[test]
    #[allow(clippy::result_large_err)]
    fn choices_and_log_levels_are_checked_at_load() {
        let refused = |var: &str, value: &str| {
            let mut out = String::new();
            figment::Jail::expect_with(|jail| {
                jail.clear_env();
                jail.set_env(var, value);
                out = Config::load(None).unwrap_err().to_string();
                Ok(())
            });
            out
        };
        let e = refused("SWITCHYARD_LOG__FORMAT", "JSON");
        assert!(
            e.contains("log.format") && e.contains("SWITCHYARD_LOG__FORMAT") && e.contains("json"),
            "{e}"
        );
        let e = refused("SWITCHYARD_TELEGRAM__MODE", "webhooks");
        assert!(
            e.contains("telegram.mode") && e.contains("polling") && e.contains("auto"),
            "{e}"
        );
        let e = refused("SWITCHYARD_HOSTS__LOST_POLICY", "retry");
        assert!(
            e.contains("hosts.lost_policy") && e.contains("requeue") && e.contains("fail"),
            "{e}"
        );
        let e = refused("SWITCHYARD_LOG__LEVEL", "verbose");
        assert!(
            e.contains("log.level") && e.contains("`verbose` is not a log level"),
            "{e}"
        );
        let e = refused("SWITCHYARD_LOG__LEVEL", "switchyard=loud");
        assert!(e.contains("log.level"), "{e}");
        let e = refused("SWITCHYARD_LOG", "verbose");
        assert!(e.contains("SWITCHYARD_LOG:"), "{e}");
        for ok in ["debug", "WARN", "switchyard=debug,info", "off"] {
            assert_eq!(check_log_filter(ok), Ok(()), "{ok}");
        }
        figment::Jail::expect_with(|jail| {
            jail.clear_env();
            jail.set_env("SWITCHYARD_LOG__FORMAT", "json");
            jail.set_env("SWITCHYARD_TELEGRAM__MODE", "polling");
            jail.set_env("SWITCHYARD_HOSTS__LOST_POLICY", "fail");
            let c = Config::load(None).map_err(|e| e.to_string())?;
            assert_eq!(c.log.format, LogFormat::Json);
            assert_eq!(c.telegram.mode, TelegramMode::Polling);
            assert_eq!(
                c.hosts.core().lost_policy,
                switchyard_protocol::hosts::HostLostPolicy::Fail
            );
            Ok(())
        });
    }

    #[test]
    fn trusted_ingress_mode_needs_a_proof() {
        let mut c = Config {
            hosts_client_cert_header: Some("x-ssl-client-cert".into()),
            ..Config::default()
        };
        let e = c.validate().expect_err("no proof configured").to_string();
        assert!(e.contains("hosts_ingress_secret"), "{e}");
        c.hosts_ingress_secret = SecretList(vec![Secret::new("short")]);
        assert!(c.validate().is_err(), "a short secret is refused");
        c.hosts_ingress_secret = SecretList(vec![Secret::new("0123456789abcdef")]);
        c.validate().expect("a secret is proof");
        c.hosts_ingress_secret = SecretList::default();
        c.hosts_ingress_sources = CidrList(vec!["10.0.0.0/8".parse().unwrap()]);
        c.validate().expect("a source range is proof");
    }

    #[test]
    fn operator_tokens_are_judged_trimmed() {
        let mut c = Config::default();
        for bad in [
            "ops=                ",
            "ops=   short-token      ",
            "   =0123456789abcdef",
            "ops",
        ] {
            c.operator_tokens = SecretList(vec![Secret::new(bad)]);
            assert!(c.validate().is_err(), "{bad:?} was accepted");
        }
        c.operator_tokens = SecretList(vec![Secret::new(" ops = 0123456789abcdef ")]);
        assert!(c.validate().is_ok());
        assert_eq!(
            c.operators(),
            vec![("ops".to_owned(), "0123456789abcdef".to_owned())]
        );
    }

    #[test]
    #[allow(clippy::result_large_err)]
    fn outbound_allow_private_is_a_list_of_ranges() {
        figment::Jail::expect_with(|jail| {
            jail.clear_env();
            jail.set_env("SWITCHYARD_OUTBOUND__ALLOW_PRIVATE", "127.0.0.0/8, ::1/128");
            let c = Config::load(None).map_err(|e| e.to_string())?;
            let p = c.outbound.policy();
            assert!(p.check_ip("127.0.0.1".parse().unwrap()).is_ok());
            assert!(p.check_ip("::1".parse().unwrap()).is_ok());
            assert!(p.check_ip("10.0.0.1".parse().unwrap()).is_err());
            jail.set_env("SWITCHYARD_OUTBOUND__ALLOW_PRIVATE", "127.0.0.0/33");
            assert!(Config::load(None).is_err());
            Ok(())
        });
        assert!(
            Config::default()
                .outbound
                .policy()
                .check_ip("169.254.169.254".parse().unwrap())
                .is_err()
        );
    }

    #[test]
    // figment's Jail API fixes the closure's error type.
    #[allow(clippy::result_large_err)]
    fn env_overrides_nested_keys() {
        figment::Jail::expect_with(|jail| {
            jail.clear_env();
            jail.set_env("SWITCHYARD_LISTEN", "0.0.0.0:1234");
            jail.set_env("SWITCHYARD_LEASE__CONNECTOR_GRACE", "2s");
            jail.set_env("SWITCHYARD_S3__BUCKET", "b");
            jail.set_env("SWITCHYARD_SIGNING_KEYS", "k1,k2");
            let c = Config::load(None).map_err(|e| e.to_string())?;
            assert_eq!(c.listen, "0.0.0.0:1234");
            assert_eq!(c.lease.connector_grace, Dur(Duration::from_secs(2)));
            assert_eq!(c.s3.bucket.as_deref(), Some("b"));
            assert_eq!(c.signing_keys.0.len(), 2);
            assert!(!format!("{c:?}").contains("k1"));
            Ok(())
        });
    }
}
