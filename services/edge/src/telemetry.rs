//! Logs and metrics, installed once per process.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;

use crate::config::LogConfig;

static PROMETHEUS: OnceLock<PrometheusHandle> = OnceLock::new();

/// The process-wide Prometheus recorder (tests start several pods in one process).
pub fn prometheus() -> PrometheusHandle {
    PROMETHEUS
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new().build_recorder();
            let handle = recorder.handle();
            // Fails only if another recorder was installed first; metrics then go there.
            let _ = metrics::set_global_recorder(recorder);
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
