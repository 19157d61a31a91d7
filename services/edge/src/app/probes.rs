//! The internal listener's routes: liveness, readiness from the pod's own backend checks,
//! and the Prometheus text.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use switchyard_core::engine::Hub;
use switchyard_core::store::Store;

use crate::config::Config;

/// `/metrics`, `/livez` and `/readyz`; `/readyz` fails once `draining` is set.
pub(super) fn router(
    readiness: Arc<crate::readiness::Readiness>,
    store: Arc<dyn Store>,
    draining: Arc<AtomicBool>,
) -> Router {
    Router::new()
        .route("/metrics", get(metrics_text))
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .with_state(Probe {
            readiness,
            store,
            draining,
        })
}

#[derive(Clone)]
struct Probe {
    readiness: Arc<crate::readiness::Readiness>,
    store: Arc<dyn Store>,
    draining: Arc<AtomicBool>,
}

/// Liveness never depends on a backend (a backend outage must not restart healthy pods).
async fn livez() -> impl IntoResponse {
    "ok"
}

/// Answers from the pod's own backend checks (crate::readiness), never by pinging here.
async fn readyz(State(p): State<Probe>) -> axum::response::Response {
    if p.draining.load(Ordering::SeqCst) {
        return (StatusCode::SERVICE_UNAVAILABLE, "draining").into_response();
    }
    match p.readiness.verdict() {
        Ok(()) => (StatusCode::OK, "ready").into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e).into_response(),
    }
}

/// The shared backends `/readyz` follows: the store, the bus and the ephemeral state.
pub(super) fn readiness(cfg: &Config, hub: &Arc<Hub>) -> Arc<crate::readiness::Readiness> {
    use crate::readiness::check_fn;
    let r =
        crate::readiness::Readiness::new(cfg.readiness.failure_threshold, cfg.readiness.timeout.0);
    let reason = |e: switchyard_core::error::BackendError| format!("{:?}: {}", e.kind, e.context);
    let store = hub.store().clone();
    r.add(
        "store",
        check_fn(move || {
            let store = store.clone();
            async move { store.ping().await.map_err(reason) }
        }),
    );
    let bus = hub.bus().clone();
    r.add(
        "bus",
        check_fn(move || {
            let up = bus.is_connected();
            async move {
                if up {
                    Ok(())
                } else {
                    Err("disconnected".to_owned())
                }
            }
        }),
    );
    let ephemeral = hub.ephemeral().clone();
    r.add(
        "ephemeral",
        check_fn(move || {
            let e = ephemeral.clone();
            async move { e.ping().await.map_err(reason) }
        }),
    );
    Arc::new(r)
}

async fn metrics_text(State(p): State<Probe>) -> impl IntoResponse {
    crate::telemetry::process_metrics();
    crate::telemetry::pool_metrics(p.store.as_ref());
    crate::telemetry::prometheus().render()
}
