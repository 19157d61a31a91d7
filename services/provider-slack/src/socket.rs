//! Socket Mode: exactly one connection per Slack app in the whole deployment.
//!
//! Every pod runs a supervisor that reloads the bound channels (periodically, and when a
//! binding is made or released here) and runs a task per app under the leased single
//! consumer of the provider kit's [`Lease`] (lease `socket:<app_key>`): only the holder connects
//! (`apps.connections.open` with the app-level token, then the WebSocket it names). An
//! envelope is acknowledged with its `envelope_id` only once its message is durably stored;
//! one not acknowledged is sent again by Slack, and the event id and the store's
//! de-duplication keep a repeat from being delivered twice. A `disconnect` (Slack refreshes
//! connections every few hours) finishes the envelopes in hand, acknowledges them, and
//! opens a new connection at once.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use switchyard_core::ProviderServices;
use switchyard_provider_kit::{Consumers, Lease, LeaseConfig, pause, reconnect_wait};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

use crate::Runtime;
use crate::inbound::{Handled, handle_event};
use crate::registry::Bound;

/// The supervisor loop of one pod; ends (giving its leases up) when `stop` is cancelled.
pub(crate) async fn supervise(
    rt: Arc<Runtime>,
    services: Arc<dyn ProviderServices>,
    stop: CancellationToken,
) {
    let mut tasks = Consumers::new(&stop);
    loop {
        reconcile(&rt, &services, &mut tasks).await;
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(rt.cfg.refresh_interval) => {}
            _ = rt.kick.notified() => {}
        }
    }
    tasks.shutdown().await;
}

async fn reconcile(rt: &Arc<Runtime>, services: &Arc<dyn ProviderServices>, tasks: &mut Consumers) {
    if let Err(e) = rt.registry.refresh(services.as_ref()).await {
        tracing::warn!(error = %e, "bound slack channels not reloaded; retried at the next refresh");
        return;
    }
    let mut wanted = HashMap::new();
    for (key, mut bounds) in rt.registry.socket_apps() {
        let mut live = Vec::new();
        for b in bounds.drain(..) {
            if !rt.is_revoked(services.as_ref(), &b.creds).await {
                live.push(b);
            }
        }
        if live.is_empty() {
            continue;
        }
        let fp: Vec<String> = live
            .iter()
            .map(|b| format!("{}={}", b.channel_id, b.creds.fingerprint()))
            .collect();
        wanted.insert(key, (fp.join(","), live));
    }
    tasks.retain(
        &wanted
            .iter()
            .map(|(k, (fp, _))| (k.clone(), fp.clone()))
            .collect(),
    );
    for (key, (fp, bounds)) in wanted {
        let (rt, services, app_key) = (rt.clone(), services.clone(), key.clone());
        tasks.ensure(&key, &fp, move |stop| {
            run_app(rt, services, app_key, bounds, stop)
        });
    }
    metrics::gauge!("switchyard_slack_socket_apps").set(tasks.len() as f64);
}

/// How one connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// `stop` was cancelled.
    Stopped,
    /// A renewal failed: another pod may hold the lease now.
    LostLease,
    /// Slack refused the credentials: the consumer stops for good.
    Revoked,
    /// A drop or failure: connect again after a back-off.
    Failed,
    /// Slack asked for a new connection: connect again at once.
    Again,
}

async fn run_app(
    rt: Arc<Runtime>,
    services: Arc<dyn ProviderServices>,
    app_key: String,
    bounds: Vec<Arc<Bound>>,
    stop: CancellationToken,
) {
    let cfg = LeaseConfig {
        ttl: rt.cfg.lease_ttl,
        retry: rt.cfg.lease_retry,
        backoff: rt.cfg.reconnect_backoff,
    };
    let name = format!("socket:{app_key}");
    let mut lease = Lease::new(services.clone(), name, "slack socket mode", cfg);
    let mut failures: u32 = 0;
    while lease.hold(&stop).await.is_some() {
        let ended = serve(&rt, services.as_ref(), &app_key, &bounds, &mut lease, &stop).await;
        if matches!(ended, Ended::Failed | Ended::Again) {
            metrics::counter!("switchyard_slack_reconnects_total").increment(1);
        }
        match ended {
            Ended::Stopped => break,
            Ended::Revoked => {
                if let Some(b) = bounds.first() {
                    rt.on_revoked(services.as_ref(), &b.creds, &b.channel_id)
                        .await;
                }
                break;
            }
            Ended::LostLease | Ended::Again => failures = 0,
            Ended::Failed => {
                failures = failures.saturating_add(1);
                let wait = reconnect_wait(
                    rt.cfg.reconnect_backoff,
                    rt.cfg.max_reconnect_backoff,
                    failures,
                );
                if !pause(&stop, wait).await {
                    break;
                }
            }
        }
    }
    lease.release().await;
}

type Done = (String, Handled);

/// One connection, from `apps.connections.open` until it ends.
async fn serve(
    rt: &Runtime,
    services: &dyn ProviderServices,
    app_key: &str,
    bounds: &[Arc<Bound>],
    lease: &mut Lease,
    stop: &CancellationToken,
) -> Ended {
    let Some(token) = bounds.first().and_then(|b| b.creds.app_token.clone()) else {
        return Ended::Stopped;
    };
    let url = match rt.api.connections_open(&token).await {
        Ok(u) => u,
        Err(e) if e.is_auth_refused() => return Ended::Revoked,
        Err(e) => {
            tracing::info!(app_key, error = %e.summary(), "slack socket mode url not obtained");
            return Ended::Failed;
        }
    };
    let connected = tokio::time::timeout(
        rt.cfg.request_timeout,
        // No Nagle (`true`): acks are small frames that must not wait for a delayed ACK.
        tokio_tungstenite::connect_async_with_config(url.expose(), None, true),
    )
    .await;
    let ws = match connected {
        Ok(Ok((ws, _))) => ws,
        // The error text can hold the URL (with its ticket): only a fixed text is logged.
        _ => {
            tracing::info!(app_key, "slack socket mode connection refused or timed out");
            return Ended::Failed;
        }
    };
    metrics::counter!("switchyard_slack_connections_total").increment(1);
    tracing::info!(app_key, "slack socket mode connection open");
    let (mut sink, mut stream) = ws.split();
    let mut ping = tokio::time::interval(rt.cfg.ping_interval);
    ping.tick().await;
    let mut last_seen = Instant::now();
    let mut inflight = FuturesUnordered::new();
    let max_inflight = rt.cfg.max_inflight_events.max(1);
    let ack = |id: &str| Message::Text(json!({"envelope_id": id}).to_string().into());
    let ended = loop {
        tokio::select! {
            _ = stop.cancelled() => break Ended::Stopped,
            Some((envelope_id, handled)) = inflight.next(), if !inflight.is_empty() => {
                let (envelope_id, handled): Done = (envelope_id, handled);
                match handled {
                    Handled::Done => {
                        if sink.send(ack(&envelope_id)).await.is_err() {
                            break Ended::Failed;
                        }
                        metrics::counter!("switchyard_slack_envelopes_acked_total").increment(1);
                    }
                    // Not acknowledged: Slack sends it again.
                    Handled::Retry => {}
                    Handled::Revoked => break Ended::Revoked,
                }
            }
            msg = stream.next(), if inflight.len() < max_inflight => {
                last_seen = Instant::now();
                let text = match msg {
                    Some(Ok(Message::Text(t))) => t,
                    Some(Ok(Message::Binary(_) | Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => continue,
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break Ended::Failed,
                };
                if text.len() > rt.cfg.max_event_bytes {
                    tracing::warn!(app_key, "oversized slack envelope skipped");
                    continue;
                }
                let v: Value = serde_json::from_str(text.as_str()).unwrap_or(Value::Null);
                match v.get("type").and_then(Value::as_str).unwrap_or("") {
                    "hello" => tracing::debug!(app_key, "slack socket mode hello"),
                    "disconnect" => {
                        let reason = v.get("reason").and_then(Value::as_str).unwrap_or("");
                        tracing::info!(app_key, reason, "slack asked for a new socket mode connection");
                        break match reason {
                            "link_disabled" => Ended::Revoked,
                            // Another consumer holds Slack's ten connections: back off.
                            "too_many_websockets" => Ended::Failed,
                            _ => Ended::Again,
                        };
                    }
                    kind => {
                        let Some(envelope_id) = v.get("envelope_id").and_then(Value::as_str).map(str::to_owned) else {
                            continue;
                        };
                        if kind != "events_api" {
                            // Interactivity and slash commands are not used: acknowledged so they stop.
                            if sink.send(ack(&envelope_id)).await.is_err() {
                                break Ended::Failed;
                            }
                            continue;
                        }
                        let payload = v.get("payload").cloned().unwrap_or(Value::Null);
                        let team = payload.get("team_id").and_then(Value::as_str).unwrap_or("");
                        let Some(bound) = bounds.iter().find(|b| b.creds.team_id == team || bounds.len() == 1 && team.is_empty()).cloned() else {
                            // Another workspace of the app that no channel here serves.
                            if sink.send(ack(&envelope_id)).await.is_err() {
                                break Ended::Failed;
                            }
                            continue;
                        };
                        inflight.push(async move {
                            let h = handle_event(rt, services, &bound, &payload).await;
                            (envelope_id, h)
                        });
                    }
                }
            }
            _ = ping.tick() => {
                if last_seen.elapsed() > rt.cfg.ping_interval * 3 {
                    tracing::info!(app_key, "slack socket mode connection silent; reconnecting");
                    break Ended::Failed;
                }
                if sink.send(Message::Ping(Vec::new().into())).await.is_err() {
                    break Ended::Failed;
                }
            }
            _ = lease.renewal_due() => {
                if lease.renew().await.is_err() {
                    break Ended::LostLease;
                }
            }
        }
    };
    // Envelopes being stored finish and are acknowledged before the connection closes, so
    // a drain or a refresh loses nothing and repeats nothing it could avoid.
    if matches!(ended, Ended::Stopped | Ended::LostLease | Ended::Again) {
        let deadline = tokio::time::sleep(Duration::from_secs(5));
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                _ = &mut deadline => break,
                next = inflight.next() => match next {
                    Some((envelope_id, Handled::Done)) => {
                        let _ = sink.send(ack(&envelope_id)).await;
                    }
                    Some(_) => {}
                    None => break,
                }
            }
        }
    }
    // The close handshake completes (bounded) before a new connection may open, so this
    // app never has two connections from this deployment, not even for a moment.
    let _ = sink.send(Message::Close(None)).await;
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        while let Some(Ok(_)) = stream.next().await {}
    })
    .await;
    ended
}
