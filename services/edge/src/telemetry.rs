//! Logs and metrics, installed once per process.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;

use crate::config::LogConfig;

static PROMETHEUS: OnceLock<PrometheusHandle> = OnceLock::new();

/// The process-wide Prometheus recorder (tests start several pods in one process).
pub fn prometheus() -> PrometheusHandle {
    PROMETHEUS
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full("switchyard_commit_batch_size".into()),
                    &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0],
                )
                .map(|b| b.build_recorder())
                .unwrap_or_else(|_| PrometheusBuilder::new().build_recorder());
            let handle = recorder.handle();
            // Fails only if another recorder was installed first; metrics then go there.
            let _ = metrics::set_global_recorder(recorder);
            describe_and_register();
            handle
        })
        .clone()
}

/// Installs the log subscriber; a second call is a no-op.
pub fn init_logging(cfg: &LogConfig) {
    let filter =
        EnvFilter::try_from_env("SWITCHYARD_LOG").unwrap_or_else(|_| EnvFilter::new(&cfg.level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if cfg.format == "json" {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

/// Every limit name `switchyard_limits_hit_total{limit}` can carry.
const LIMITS: [&str; 15] = [
    "ingress_body_bytes",
    "ingress_body_timeout",
    "ingress_concurrency_pod",
    "ingress_concurrency_channel",
    "ingress_multipart_headers",
    "preauth_body_bytes",
    "outbound_private_address",
    "client_error_log",
    "socket_send_queue",
    "hello_timeout",
    "ws_frame",
    "commit_backlog",
    "connections",
    "ws_keepalive",
    "auth_per_socket",
];

/// `# HELP` for the data plane's series, and the series that alerts use with `rate()`
/// registered at zero, so they exist before their first event.
fn describe_and_register() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_gauge!(
        "switchyard_build_info",
        "1, labelled with the build's version and git revision"
    );
    describe_gauge!(
        "switchyard_sockets",
        "open xAgent data-plane sockets on this pod"
    );
    describe_gauge!(
        "switchyard_connector_subscriptions",
        "connector_ids this pod listens to on the bus"
    );
    describe_gauge!(
        "switchyard_commit_queue_depth",
        "inbound messages waiting for a group commit (the pod's backlog)"
    );
    describe_histogram!(
        "switchyard_commit_batch_size",
        "inbound messages stored per group-commit transaction"
    );
    describe_counter!(
        "switchyard_inbound_messages_total",
        "messages from target systems, by card and outcome (stored, duplicate, full, unknown_channel)"
    );
    describe_counter!(
        "switchyard_ingress_refused_total",
        "inbound refused by backpressure: reason pod_backlog (503) or channel_full (429)"
    );
    describe_counter!(
        "switchyard_deliveries_total",
        "connector -> xAgent delivery outcomes, by card and outcome (delivered, rejected, retry)"
    );
    describe_counter!(
        "switchyard_limits_hit_total",
        "requests refused or sockets closed by a limit, by limit name"
    );
    describe_counter!(
        "switchyard_packets_total",
        "packets received from xAgent, by type"
    );
    describe_counter!(
        "switchyard_packets_rejected_total",
        "packets from xAgent refused before handling, by error code"
    );
    describe_counter!(
        "switchyard_hello_total",
        "connector.hello accepted, by card"
    );
    describe_counter!(
        "switchyard_doorbell_failures_total",
        "doorbells that could not be published (the sweep picks the work up)"
    );
    describe_counter!(
        "switchyard_janitor_sweeps_total",
        "janitor sweeps run by the lease holder"
    );
    describe_counter!(
        "switchyard_tool_calls_total",
        "tool calls, by card and outcome"
    );
    describe_counter!(
        "switchyard_outbound_messages_total",
        "xAgent -> target messages, by card and outcome"
    );
    for reason in ["pod_backlog", "channel_full"] {
        metrics::counter!("switchyard_ingress_refused_total", "reason" => reason).absolute(0);
    }
    for limit in LIMITS {
        metrics::counter!("switchyard_limits_hit_total", "limit" => limit).absolute(0);
    }
    describe_counter!(
        "switchyard_quota_refused_total",
        "requests refused by a tenant quota, by quota name (never by tenant)"
    );
    for quota in switchyard_core::quota::QUOTA_NAMES {
        metrics::counter!("switchyard_quota_refused_total", "quota" => quota).absolute(0);
    }
    metrics::counter!("switchyard_doorbell_failures_total").absolute(0);
    metrics::counter!("switchyard_janitor_sweeps_total").absolute(0);
    metrics::gauge!("switchyard_sockets").increment(0.0);
    metrics::gauge!("switchyard_commit_queue_depth").set(0.0);
}

/// `switchyard_build_info{version, git_rev} 1`.
pub fn build_info_metric(version: &str, git_rev: &str) {
    metrics::gauge!(
        "switchyard_build_info",
        "version" => version.to_owned(),
        "git_rev" => git_rev.to_owned()
    )
    .set(1.0);
}
