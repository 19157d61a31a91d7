//! Logs and metrics, installed once per process.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;

use crate::config::{LogConfig, LogFormat};

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
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
                })
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

/// Installs the log subscriber; a second call is a no-op. Colours only when stderr is a
/// terminal: redirected logs (files, `kubectl logs`, collectors) get plain text.
pub fn init_logging(cfg: &LogConfig) {
    use std::io::IsTerminal;
    let filter =
        EnvFilter::try_from_env("SWITCHYARD_LOG").unwrap_or_else(|_| EnvFilter::new(&cfg.level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = match cfg.format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// Buckets of every `*_seconds` histogram: 1 ms to 1 min (the console's charts read them).
pub use switchyard_core::tally::LATENCY_BUCKETS;

/// Every limit name `switchyard_limits_hit_total{limit}` can carry.
const LIMITS: &[&str] = &[
    "ingress_body_bytes",
    "ingress_body_timeout",
    "ingress_concurrency_pod",
    "ingress_concurrency_channel",
    "ingress_concurrency_tenant",
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
    "operator_auth_source",
    "operator_requests",
    "signature_refusal_log",
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
        "switchyard_console_tenants_untracked_total",
        "events of tenants past the pod's cap of tenants counted for the console's tenant charts"
    );
    describe_counter!(
        "switchyard_outbound_messages_total",
        "xAgent -> target messages, by card and outcome"
    );
    for reason in ["pod_backlog", "channel_full"] {
        metrics::counter!("switchyard_ingress_refused_total", "reason" => reason).absolute(0);
    }
    for &limit in LIMITS {
        metrics::counter!("switchyard_limits_hit_total", "limit" => limit).absolute(0);
    }
    describe_counter!(
        "switchyard_quota_refused_total",
        "requests refused by a tenant quota, by quota name (never by tenant)"
    );
    for quota in switchyard_core::quota::QUOTA_NAMES {
        metrics::counter!("switchyard_quota_refused_total", "quota" => quota).absolute(0);
    }
    describe_ops();
    describe_engine();
    switchyard_core::hosts::describe_metrics();
    switchyard_core::journal::describe_metrics();
    crate::providers::describe_metrics();
    metrics::counter!("switchyard_doorbell_failures_total").absolute(0);
    metrics::counter!("switchyard_janitor_sweeps_total").absolute(0);
    metrics::gauge!("switchyard_sockets").increment(0.0);
    metrics::gauge!("switchyard_commit_queue_depth").set(0.0);
}

/// The engine's per-card counters without a histogram (described here, registered per card
/// by [`register_connectors`]) and the deployment-wide ones.
fn describe_engine() {
    use metrics::describe_counter;
    use switchyard_protocol::ErrorCode;
    describe_counter!(
        "switchyard_files_stored_total",
        "files stored (inbound attachments and xAgent uploads), by card"
    );
    describe_counter!(
        "switchyard_file_bytes_total",
        "bytes of the files stored, by card"
    );
    describe_counter!(
        "switchyard_tool_replays_total",
        "tool calls answered from the stored result of an earlier call with the same key, by card"
    );
    describe_counter!(
        "switchyard_auth_completed_total",
        "authorization flows completed (a channel bound), by card"
    );
    describe_counter!(
        "switchyard_connectors_deregistered_total",
        "connector_ids deregistered by the janitor after their grace period"
    );
    describe_counter!(
        "switchyard_hosts_tls_handshake_failures_total",
        "agent-host TLS handshakes that failed, by reason (error, timeout)"
    );
    metrics::counter!("switchyard_connectors_deregistered_total").absolute(0);
    for kind in switchyard_protocol::outbound::KINDS
        .into_iter()
        .chain(["other"])
    {
        metrics::counter!("switchyard_packets_total", "type" => kind).absolute(0);
    }
    for code in [
        ErrorCode::InvalidPacket,
        ErrorCode::HelloRequired,
        ErrorCode::UnsupportedPacket,
        ErrorCode::PacketTooLarge,
        ErrorCode::RateLimited,
        ErrorCode::Busy,
    ] {
        metrics::counter!("switchyard_packets_rejected_total", "code" => code.as_str()).absolute(0);
    }
    for reason in ["error", "timeout"] {
        metrics::counter!("switchyard_hosts_tls_handshake_failures_total", "reason" => reason)
            .absolute(0);
    }
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

/// Why an authentication or signature check refused a request
/// (`switchyard_auth_rejected_total{reason}`).
pub const AUTH_REJECTIONS: [&str; 5] = [
    "api_key_missing",
    "api_key_invalid",
    "webhook_signature",
    "telegram_secret",
    "ingress_proof",
];

/// The operations series (latency histograms, state gauges, process metrics): described,
/// and registered at zero where their labels are known before the first event.
fn describe_ops() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_histogram!(
        "switchyard_http_request_duration_seconds",
        metrics::Unit::Seconds,
        "HTTP requests until the response head, by listener, route template, method and status"
    );
    describe_histogram!(
        "switchyard_delivery_latency_seconds",
        metrics::Unit::Seconds,
        "inbound messages from accepted (stored) to acknowledged by xAgent, by card"
    );
    describe_histogram!(
        "switchyard_tool_call_duration_seconds",
        metrics::Unit::Seconds,
        "tool calls from tool.invoke to the result, by card and declared tool"
    );
    describe_histogram!(
        "switchyard_provider_send_duration_seconds",
        metrics::Unit::Seconds,
        "xAgent -> target sends through a provider, by card"
    );
    describe_histogram!(
        "switchyard_store_operation_duration_seconds",
        metrics::Unit::Seconds,
        "store work on the data plane's hot path, by operation (commit_batch, pending_read, ack_batch)"
    );
    describe_histogram!(
        "switchyard_janitor_sweep_duration_seconds",
        metrics::Unit::Seconds,
        "janitor sweeps (connectors, channels, files, hosts) run by the lease holder"
    );
    describe_gauge!(
        "switchyard_janitor_leader",
        "1 while this pod holds the janitor lease"
    );
    describe_gauge!("switchyard_draining", "1 once this pod started draining");
    describe_gauge!(
        "switchyard_channels",
        "channels routed to xAgent sockets on this pod"
    );
    describe_gauge!(
        "switchyard_outbox_pending",
        "inbound messages stored and not yet acknowledged, deployment-wide (set by the janitor lease holder)"
    );
    describe_gauge!(
        "switchyard_outbox_oldest_pending_seconds",
        "age of the oldest pending inbound message, deployment-wide (set by the janitor lease holder)"
    );
    describe_gauge!(
        "switchyard_backend_up",
        "1 while the backend passes the pod's readiness checks (0 after readiness.failure_threshold failures)"
    );
    describe_counter!(
        "switchyard_backend_errors_total",
        "failed readiness checks of a backend (store, bus, ephemeral)"
    );
    describe_counter!(
        "switchyard_auth_rejected_total",
        "requests refused by an API key, signature, secret or ingress-proof check, by reason"
    );
    describe_gauge!(
        "switchyard_store_pool_connections",
        "store connection pool: connections open (state=open) and idle (state=idle)"
    );
    describe_gauge!(
        "process_resident_memory_bytes",
        metrics::Unit::Bytes,
        "resident set size"
    );
    describe_gauge!(
        "process_cpu_seconds_total",
        metrics::Unit::Seconds,
        "user and system CPU time of the process"
    );
    describe_gauge!("process_open_fds", "open file descriptors");
    describe_gauge!("process_max_fds", "file descriptor limit");
    describe_gauge!("process_threads", "OS threads of the process");
    for reason in AUTH_REJECTIONS {
        metrics::counter!("switchyard_auth_rejected_total", "reason" => reason).absolute(0);
    }
    for op in ["commit_batch", "pending_read", "ack_batch"] {
        let _ = metrics::histogram!("switchyard_store_operation_duration_seconds", "op" => op);
    }
    let _ = metrics::histogram!("switchyard_janitor_sweep_duration_seconds");
    let _ = metrics::histogram!("switchyard_commit_batch_size");
    metrics::gauge!("switchyard_janitor_leader").set(0.0);
    metrics::gauge!("switchyard_draining").set(0.0);
    metrics::gauge!("switchyard_channels").increment(0.0);
    metrics::gauge!("switchyard_outbox_pending").increment(0.0);
    metrics::gauge!("switchyard_outbox_oldest_pending_seconds").increment(0.0);
    process_metrics();
}

/// Registers the per-card series of the mounted connectors at zero: inbound, delivery,
/// outbound, tool and file counters per outcome, delivery and send latency per card, tool latency per declared tool, and the HTTP histogram of each
/// connector's health route (other routes appear with their first request).
pub fn register_connectors(cards: &[(String, &'static str, Vec<String>)]) {
    use metrics::counter;
    for (card, prefix, tools) in cards {
        for outcome in ["stored", "duplicate", "full", "unknown_channel"] {
            counter!("switchyard_inbound_messages_total", "card" => card.clone(), "outcome" => outcome).absolute(0);
        }
        for outcome in ["delivered", "rejected", "retry"] {
            counter!("switchyard_deliveries_total", "card" => card.clone(), "outcome" => outcome)
                .absolute(0);
        }
        for status in ["accepted", "duplicate", "rejected"] {
            counter!("switchyard_outbound_messages_total", "card" => card.clone(), "status" => status).absolute(0);
        }
        for outcome in ["ok", "error", "retryable"] {
            counter!("switchyard_tool_calls_total", "card" => card.clone(), "outcome" => outcome)
                .absolute(0);
        }
        for name in [
            "switchyard_files_stored_total",
            "switchyard_file_bytes_total",
            "switchyard_tool_replays_total",
            "switchyard_auth_completed_total",
        ] {
            counter!(name, "card" => card.clone()).absolute(0);
        }
        let _ = metrics::histogram!("switchyard_delivery_latency_seconds", "card" => card.clone());
        let _ = metrics::histogram!("switchyard_provider_send_duration_seconds", "card" => card.clone());
        for tool in tools {
            let _ = metrics::histogram!("switchyard_tool_call_duration_seconds", "card" => card.clone(), "tool" => tool.clone());
        }
        let _ = metrics::histogram!(
            "switchyard_http_request_duration_seconds",
            "listener" => "public",
            "route" => format!("{prefix}/health"),
            "method" => "GET",
            "status" => "200"
        );
    }
}

/// Process metrics read from /proc at scrape time (Linux; elsewhere they stay absent).
pub fn process_metrics() {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return;
    };
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
    };
    if let Some(kb) = field("VmRSS:") {
        metrics::gauge!("process_resident_memory_bytes").set(kb * 1024.0);
    }
    if let Some(n) = field("Threads:") {
        metrics::gauge!("process_threads").set(n);
    }
    // utime and stime (fields 14 and 15) in clock ticks of USER_HZ, 100 on Linux; the
    // command name (field 2) may hold spaces, so count from its closing parenthesis.
    if let Ok(stat) = std::fs::read_to_string("/proc/self/stat")
        && let Some((_, rest)) = stat.rsplit_once(')')
    {
        let f: Vec<&str> = rest.split_whitespace().collect();
        if let (Some(u), Some(s)) = (
            f.get(11).and_then(|v| v.parse::<f64>().ok()),
            f.get(12).and_then(|v| v.parse::<f64>().ok()),
        ) {
            metrics::gauge!("process_cpu_seconds_total").set((u + s) / 100.0);
        }
    }
    if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
        metrics::gauge!("process_open_fds").set(dir.count() as f64);
    }
    if let Ok(limits) = std::fs::read_to_string("/proc/self/limits")
        && let Some(max) = limits
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .and_then(|l| l.split_whitespace().nth(3))
            .and_then(|v| v.parse::<f64>().ok())
    {
        metrics::gauge!("process_max_fds").set(max);
    }
}

/// A request id: the caller's `X-Request-Id` when it is short and plain, else a new one.
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

fn request_id_of(headers: &axum::http::HeaderMap) -> String {
    headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| {
            !v.is_empty()
                && v.len() <= 64
                && v.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
        })
        .map_or_else(|| switchyard_core::ids::random_secret(8), str::to_owned)
}

/// Outermost middleware of a listener: gives the request its id (in the request's
/// extensions for the trace span, and in the `X-Request-Id` answer header) and records
/// `switchyard_http_request_duration_seconds` by route template (never the raw path, which
/// carries channel ids, file refs and tokens).
pub async fn track_http(
    listener: &'static str,
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let started = std::time::Instant::now();
    let id = request_id_of(req.headers());
    req.extensions_mut().insert(RequestId(id.clone()));
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |m| m.as_str().to_owned());
    let method: &'static str = match *req.method() {
        axum::http::Method::GET => "GET",
        axum::http::Method::POST => "POST",
        axum::http::Method::PUT => "PUT",
        axum::http::Method::DELETE => "DELETE",
        axum::http::Method::HEAD => "HEAD",
        axum::http::Method::OPTIONS => "OPTIONS",
        axum::http::Method::PATCH => "PATCH",
        _ => "other",
    };
    let mut resp = next.run(req).await;
    if let Ok(v) = axum::http::HeaderValue::from_str(&id) {
        resp.headers_mut().insert("x-request-id", v);
    }
    metrics::histogram!(
        "switchyard_http_request_duration_seconds",
        "listener" => listener,
        "route" => route,
        "method" => method,
        "status" => resp.status().as_u16().to_string()
    )
    .record(started.elapsed().as_secs_f64());
    resp
}

/// The request's id, for its trace span.
pub fn request_id(req: &axum::http::Request<axum::body::Body>) -> String {
    req.extensions()
        .get::<RequestId>()
        .map_or_else(String::new, |r| r.0.clone())
}

/// Wraps a listener's router: a trace span per request with its id, the pod id, method and
/// path (never the query string, which carries URL signatures and pairing tokens), and the
/// request histogram. `listener` names the listener in both.
pub fn observe(router: axum::Router, listener: &'static str, pod: &str) -> axum::Router {
    let pod = pod.to_owned();
    router
        .layer(
            tower_http::trace::TraceLayer::new_for_http().make_span_with(
                move |req: &axum::http::Request<axum::body::Body>| {
                    tracing::info_span!(
                        "http",
                        listener,
                        pod = %pod,
                        request_id = %request_id(req),
                        method = %req.method(),
                        path = %req.uri().path()
                    )
                },
            ),
        )
        .layer(axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| {
                track_http(listener, req, next)
            },
        ))
}

/// Most pending messages `switchyard_outbox_pending` counts (the query stays bounded).
pub const BACKLOG_COUNT_CAP: u64 = 100_000;

/// One janitor round: `step` (None when another pod holds the lease), then, as the lease
/// holder, `hosts` and the backlog gauges. Sets `switchyard_janitor_leader` and records the
/// sweep's duration.
pub async fn timed_sweep<R, H, E>(
    step: impl std::future::Future<Output = Result<Option<R>, E>>,
    hosts: impl std::future::Future<Output = H>,
    store: &dyn switchyard_core::Store,
) -> Result<Option<(R, H)>, E> {
    let started = std::time::Instant::now();
    let Some(report) = step.await? else {
        metrics::gauge!("switchyard_janitor_leader").set(0.0);
        return Ok(None);
    };
    metrics::gauge!("switchyard_janitor_leader").set(1.0);
    let hosts = hosts.await;
    metrics::histogram!("switchyard_janitor_sweep_duration_seconds")
        .record(started.elapsed().as_secs_f64());
    let now = switchyard_core::ids::now_ms();
    match store.outbox_backlog(now, BACKLOG_COUNT_CAP).await {
        Ok((pending, oldest)) => {
            metrics::gauge!("switchyard_outbox_pending").set(pending as f64);
            let age = oldest.map_or(0.0, |t| (now - t).max(0) as f64 / 1000.0);
            metrics::gauge!("switchyard_outbox_oldest_pending_seconds").set(age);
        }
        Err(e) => tracing::warn!(error = %e, "reading the outbox backlog failed"),
    }
    Ok(Some((report, hosts)))
}

/// The store pool's gauges, read at scrape time.
pub fn pool_metrics(store: &dyn switchyard_core::Store) {
    if let Some((open, idle)) = store.pool_stats() {
        metrics::gauge!("switchyard_store_pool_connections", "state" => "open")
            .set(f64::from(open));
        metrics::gauge!("switchyard_store_pool_connections", "state" => "idle")
            .set(f64::from(idle));
    }
}
