//! The configuration's sections (`[ingress]`, `[limits]`, `[hosts]`, `[telegram]`, ...) with
//! their defaults.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use switchyard_core::engine::{EngineConfig, OutflowLimits};
use switchyard_core::netguard::OutboundPolicy;

use super::values::*;

/// What unauthenticated callers of provider ingress (webhooks) may make a pod hold
/// (`[ingress]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IngressConfig {
    /// Largest JSON webhook body (generic webhook, Telegram updates), held until verified.
    pub max_json_bytes: u64,
    /// Time allowed to receive a webhook body.
    pub body_timeout: Dur,
    /// After this much of `body_timeout`, a generic webhook or Feishu event body must have
    /// arrived at `min_body_rate` on average.
    pub body_grace: Dur,
    /// Slowest average a generic webhook or Feishu event body may arrive at after
    /// `body_grace`, in bytes a second (0 = only `body_timeout`).
    pub min_body_rate: u64,
    /// Webhook requests in flight per pod and provider; more get 503 with Retry-After.
    pub max_concurrent: usize,
    /// Generic webhook requests in flight per tenant; more get 429 with Retry-After.
    pub max_concurrent_per_tenant: usize,
    /// Generic webhook requests and Feishu events in flight per channel; more get 429 with
    /// Retry-After.
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
            body_grace: Dur(Duration::from_secs(2)),
            min_body_rate: 4096,
            max_concurrent: 64,
            max_concurrent_per_tenant: 16,
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
        // The session's delivery bounds (window, ack wait, retry pause) are the outflow's.
        let o = OutflowLimits::default();
        Self {
            message_ttl: Dur(e.message_ttl),
            outbox_cap: e.outbox_cap,
            ack_timeout: Dur(o.ack_timeout),
            window: o.window,
            dedupe_window: Dur(e.dedupe_window),
            sweep_interval: Dur(Duration::from_secs(5)),
            retry_pause: Dur(o.retry_pause),
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
/// its own (`switchyard tenant quota`). 0 = unlimited. The defaults are what a small
/// deployment would choose; a larger one raises them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QuotasConfig {
    /// Live xAgent sockets per tenant, cluster-wide.
    pub sockets: u64,
    /// Channels per tenant, cluster-wide.
    pub channels: u64,
    /// Bytes of unexpired files and host artifacts per tenant; a file or artifact that would
    /// pass it is refused (uploads, files from chat systems, artifacts).
    pub stored_bytes: u64,
    /// Work requests (channel.open, auth.*, tool.invoke, chat.message, chat.message.delta,
    /// descriptor.get) per tenant per second on each pod, with bursts of twice that.
    pub requests_per_second: u64,
    /// Bytes of delta buffers a tenant may write to the shared ephemeral state per delta
    /// lifetime (`retention.delta_ttl`); more deltas are refused `rate_limited`.
    pub ephemeral_bytes: u64,
    /// How often each pod reloads the per-tenant overrides from the store.
    pub refresh_interval: Dur,
}

impl Default for QuotasConfig {
    fn default() -> Self {
        Self {
            sockets: 100,
            channels: 1000,
            stored_bytes: 1024 * 1024 * 1024,
            requests_per_second: 1000,
            ephemeral_bytes: 8 * 1024 * 1024,
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

/// The operator limiter (`[operator_auth]`): sign-in and Bearer tokens on the console and
/// `/admin/v1` (see `crate::operators`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OperatorAuthConfig {
    /// Wrong operator tokens from one source address (IPv4, IPv6 /64) within
    /// `failure_window`; after them, that address is answered 429 until the window ends.
    pub failures_per_source: u64,
    pub failure_window: Dur,
    /// Authenticated requests (sign-ins, Bearer calls, console pages) per operator a minute.
    pub requests_per_operator: u64,
}

impl Default for OperatorAuthConfig {
    fn default() -> Self {
        Self {
            failures_per_source: 10,
            failure_window: Dur(Duration::from_secs(300)),
            requests_per_operator: 600,
        }
    }
}

impl OperatorAuthConfig {
    pub fn limits(&self) -> crate::operators::OperatorLimits {
        crate::operators::OperatorLimits {
            failures_per_source: self.failures_per_source,
            failure_window: self.failure_window.0,
            requests_per_operator: self.requests_per_operator,
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
