//! The pod's background loops: quota reloads, presence heartbeats and the janitor's sweeps
//! (connectors, channels, files and hosts, by the one lease holder).

use std::sync::Arc;
use std::time::Duration;

use switchyard_core::engine::{Hub, Janitor};
use switchyard_core::hosts::Hosts;
use switchyard_core::ids::now_ms;
use tokio_util::sync::CancellationToken;

/// Reloads the tenants' quota overrides (`switchyard tenant quota`), so a change reaches
/// every pod within one interval.
pub(super) async fn quota_loop(hub: Arc<Hub>, every: Duration, stop: CancellationToken) {
    let mut t = tokio::time::interval(every.max(Duration::from_millis(100)));
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = t.tick() => {
                if let Err(e) = hub.quotas().refresh(hub.store().as_ref()).await {
                    tracing::warn!(error = %e, "reloading tenant quotas failed; keeping the last ones");
                }
            }
        }
    }
}

pub(super) async fn presence_loop(hub: Arc<Hub>, every: Duration, stop: CancellationToken) {
    let mut t = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = t.tick() => {
                if let Err(e) = hub.store().pod_heartbeat(hub.pod_id(), now_ms()).await {
                    tracing::warn!(error = %e, "pod heartbeat failed");
                }
            }
        }
    }
}

pub(super) async fn janitor_loop(
    janitor: Arc<Janitor>,
    hosts: Arc<Hosts>,
    every: Duration,
    stop: CancellationToken,
) {
    let mut t = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = t.tick() => match crate::telemetry::timed_sweep(janitor.step(), hosts.sweep(), hosts.hub().store().as_ref()).await {
                Ok(Some((r, hosts_sweep))) => {
                    if r.connectors_removed + r.channels_removed + r.dead_pods > 0 {
                        tracing::info!(generation = r.generation, dead_pods = r.dead_pods, connectors = r.connectors_removed, channels = r.channels_removed, files = r.files_removed, "janitor sweep");
                    }
                    // Hosts are swept by the same single lease holder.
                    match hosts_sweep {
                        Ok(h) if h.hosts_lost + h.approvals_expired + h.runs_purged > 0 => {
                            tracing::info!(hosts_lost = h.hosts_lost, runs = h.runs_requeued_or_failed, approvals_expired = h.approvals_expired, runs_purged = h.runs_purged, "host sweep");
                        }
                        Ok(_) => {}
                        Err(e) => tracing::warn!(error = %e, "host sweep failed"),
                    }
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, "janitor sweep failed"),
            }
        }
    }
}
