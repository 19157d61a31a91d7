//! The long connection: exactly one per app in the whole deployment.
//!
//! Every pod runs a supervisor that reloads the bound apps (periodically, and when a binding
//! is made or released here) and runs a task per app that receives events over the long
//! connection. Only the holder of the app's lease `ws:<app_key>` connects; the others wait
//! to take over when it stops renewing (a crash) or gives it up (drain). The holder renews
//! the lease while connected and closes the connection the moment it cannot. An event is
//! acked on the connection only once it is durably stored; an event not acked is sent again
//! by Feishu (to whichever connection is live by then), and the store's de-duplication by
//! message id keeps a repeat from being delivered twice.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::{SinkExt, StreamExt};
use serde_json::json;
use switchyard_core::ProviderServices;
use switchyard_provider_kit::{Consumers, Lease, LeaseConfig, jittered, pause};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

use crate::Runtime;
use crate::apps::App;
use crate::frame::{Frame, METHOD_CONTROL, METHOD_DATA};
use crate::inbound::{Handled, handle_event};

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
        tracing::warn!(error = %e, "bound feishu apps not reloaded; retried at the next refresh");
        return;
    }
    let mut wanted = HashMap::new();
    for app in rt.registry.all() {
        if app.creds.http_events() || rt.is_revoked(services.as_ref(), &app).await {
            continue;
        }
        wanted.insert(app.key.clone(), (rt.fingerprint(&app), app));
    }
    tasks.retain(
        &wanted
            .iter()
            .map(|(k, (fp, _))| (k.clone(), fp.clone()))
            .collect(),
    );
    for (key, (fp, app)) in wanted {
        let (rt, services) = (rt.clone(), services.clone());
        tasks.ensure(&key, &fp, move |stop| run_app(rt, services, app, stop));
    }
    metrics::gauge!("switchyard_feishu_long_connection_apps").set(tasks.len() as f64);
}

enum Ended {
    Stopped,
    LostLease,
    Revoked,
    Failed,
}

async fn run_app(
    rt: Arc<Runtime>,
    services: Arc<dyn ProviderServices>,
    app: Arc<App>,
    stop: CancellationToken,
) {
    let cfg = LeaseConfig {
        ttl: rt.cfg.lease_ttl,
        retry: rt.cfg.lease_retry,
        backoff: rt.cfg.reconnect_backoff,
    };
    let name = format!("ws:{}", app.key);
    let mut lease = Lease::new(services.clone(), name, "feishu long connection", cfg);
    let mut failures: u32 = 0;
    while lease.hold(&stop).await.is_some() {
        match connect_and_serve(&rt, services.as_ref(), &app, &mut lease, &stop).await {
            Ended::Stopped => break,
            Ended::LostLease => {
                tracing::info!(app_key = %app.key, "feishu long connection lease lost; connection closed");
                failures = 0;
            }
            Ended::Revoked => {
                rt.on_revoked(services.as_ref(), &app).await;
                break;
            }
            Ended::Failed => {
                failures = failures.saturating_add(1);
                metrics::counter!("switchyard_feishu_reconnects_total").increment(1);
                // Exponential back-off with jitter, capped; the lease is renewed at the loop top.
                let exp = rt.cfg.reconnect_backoff * 2u32.saturating_pow(failures.min(6) - 1);
                let wait = jittered(exp.min(rt.cfg.max_reconnect_backoff));
                tracing::info!(app_key = %app.key, failures, wait_ms = wait.as_millis() as u64, "feishu long connection down; reconnecting");
                if !pause(&stop, wait).await {
                    break;
                }
            }
        }
    }
    lease.release().await;
}

fn ack_frame(mut f: Frame, code: u16, biz_ms: u128) -> Vec<u8> {
    f.headers.push(("biz_rt".into(), biz_ms.to_string()));
    f.payload =
        serde_json::to_vec(&json!({"code": code, "headers": {}, "data": null})).unwrap_or_default();
    f.encode()
}

/// When the first fragment came, and the fragments so far.
type Partial = (Instant, Vec<Option<Vec<u8>>>);

/// Partial events by frame message id, bounded in bytes: fragments older than 5 s or beyond
/// the bound are dropped (Feishu sends an unacked event again).
#[derive(Default)]
struct Fragments {
    parts: HashMap<String, Partial>,
    bytes: usize,
}

impl Fragments {
    fn add(
        &mut self,
        id: &str,
        sum: usize,
        seq: usize,
        payload: Vec<u8>,
        max_bytes: usize,
    ) -> Option<Vec<u8>> {
        if sum <= 1 {
            return Some(payload);
        }
        if seq >= sum || sum > 1024 {
            return None;
        }
        let now = Instant::now();
        self.parts
            .retain(|_, (t, _)| now.duration_since(*t) < Duration::from_secs(5));
        self.bytes = self
            .parts
            .values()
            .flat_map(|(_, v)| v.iter().flatten())
            .map(Vec::len)
            .sum();
        if self.bytes + payload.len() > max_bytes {
            metrics::counter!("switchyard_feishu_fragments_dropped_total").increment(1);
            return None;
        }
        self.bytes += payload.len();
        let entry = self
            .parts
            .entry(id.to_owned())
            .or_insert_with(|| (now, vec![None; sum]));
        if entry.1.len() != sum {
            return None;
        }
        entry.1[seq] = Some(payload);
        if entry.1.iter().all(Option::is_some) {
            let (_, parts) = self.parts.remove(id)?;
            let whole: Vec<u8> = parts.into_iter().flatten().flatten().collect();
            self.bytes = self.bytes.saturating_sub(whole.len());
            return Some(whole);
        }
        None
    }
}

async fn connect_and_serve(
    rt: &Runtime,
    services: &dyn ProviderServices,
    app: &App,
    lease: &mut Lease,
    stop: &CancellationToken,
) -> Ended {
    let (url, cfg) = match rt.api.ws_endpoint(&app.creds).await {
        Ok(x) => x,
        Err(e) if e.is_app_refused() => return Ended::Revoked,
        Err(e) => {
            tracing::info!(app_key = %app.key, error = %e.summary(), "feishu long connection endpoint not obtained");
            return Ended::Failed;
        }
    };
    let service: i32 = url::Url::parse(url.expose())
        .ok()
        .and_then(|u| {
            u.query_pairs()
                .find(|(k, _)| k == "service_id")
                .map(|(_, v)| v.into_owned())
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let connected = tokio::time::timeout(
        rt.cfg.request_timeout,
        // No Nagle (`true`): acks are small frames that must not wait for a delayed ACK.
        tokio_tungstenite::connect_async_with_config(url.expose(), None, true),
    )
    .await;
    let ws = match connected {
        Ok(Ok((ws, _))) => ws,
        // The error text can hold the URL (with its ticket): only a fixed text is logged.
        Ok(Err(_)) | Err(_) => {
            tracing::info!(app_key = %app.key, "feishu long connection refused or timed out");
            return Ended::Failed;
        }
    };
    tracing::info!(app_key = %app.key, "feishu long connection open");
    metrics::counter!("switchyard_feishu_connections_total").increment(1);
    let (mut sink, mut stream) = ws.split();
    let ping_every = |secs: u64| Duration::from_secs(secs.clamp(1, 120));
    let mut ping = tokio::time::interval(if cfg.ping_interval > 0 {
        ping_every(cfg.ping_interval)
    } else {
        rt.cfg.ping_interval
    });
    let mut last_seen = Instant::now();
    let silence = rt.cfg.ping_interval.max(ping.period()) * 3;
    let mut fragments = Fragments::default();
    let mut inflight = FuturesUnordered::new();
    let max_inflight = rt.cfg.max_inflight_events.max(1);
    let ended = loop {
        tokio::select! {
            _ = stop.cancelled() => break Ended::Stopped,
            Some((frame, handled, ms)) = inflight.next(), if !inflight.is_empty() => {
                let (code, revoked) = match handled {
                    Handled::Done => (200, false),
                    Handled::Retry => (500, false),
                    Handled::Revoked => (500, true),
                };
                if sink.send(Message::Binary(ack_frame(frame, code, ms).into())).await.is_err() {
                    break Ended::Failed;
                }
                if code == 200 {
                    metrics::counter!("switchyard_feishu_events_acked_total").increment(1);
                }
                if revoked {
                    break Ended::Revoked;
                }
            }
            msg = stream.next(), if inflight.len() < max_inflight => {
                let bytes = match msg {
                    Some(Ok(Message::Binary(b))) => b,
                    Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Text(_) | Message::Frame(_))) => {
                        last_seen = Instant::now();
                        continue;
                    }
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break Ended::Failed,
                };
                last_seen = Instant::now();
                let Ok(frame) = Frame::decode(&bytes) else {
                    tracing::warn!(app_key = %app.key, "undecodable feishu frame skipped");
                    continue;
                };
                match frame.method {
                    METHOD_CONTROL => {
                        if frame.header("type") == Some("pong")
                            && let Ok(c) = serde_json::from_slice::<crate::api::ClientConfig>(&frame.payload)
                            && c.ping_interval > 0
                            && ping_every(c.ping_interval) != ping.period()
                        {
                            ping = tokio::time::interval(ping_every(c.ping_interval));
                            ping.tick().await;
                        }
                    }
                    METHOD_DATA => {
                        if frame.header("type") != Some("event") {
                            // Card callbacks and other types are not used: acked so they stop.
                            let f = frame.clone();
                            if sink.send(Message::Binary(ack_frame(f, 200, 0).into())).await.is_err() {
                                break Ended::Failed;
                            }
                            continue;
                        }
                        let id = frame.header("message_id").unwrap_or("").to_owned();
                        let sum = frame.header("sum").and_then(|s| s.parse().ok()).unwrap_or(1);
                        let seq = frame.header("seq").and_then(|s| s.parse().ok()).unwrap_or(0);
                        let mut head = frame.clone();
                        let payload = std::mem::take(&mut head.payload);
                        let Some(whole) = fragments.add(&id, sum, seq, payload, rt.cfg.max_event_bytes) else {
                            continue;
                        };
                        if whole.len() > rt.cfg.max_event_bytes {
                            continue;
                        }
                        inflight.push(async move {
                            let started = Instant::now();
                            let h = handle_event(rt, services, app, &whole).await;
                            (head, h, started.elapsed().as_millis())
                        });
                    }
                    _ => {}
                }
            }
            _ = ping.tick() => {
                if last_seen.elapsed() > silence {
                    tracing::info!(app_key = %app.key, "feishu long connection silent; reconnecting");
                    break Ended::Failed;
                }
                let f = Frame { service, method: METHOD_CONTROL, headers: vec![("type".into(), "ping".into())], ..Frame::default() };
                if sink.send(Message::Binary(f.encode().into())).await.is_err() {
                    break Ended::Failed;
                }
            }
            _ = lease.renewal_due() => {
                // The last renewal is at most a third of the lease old: a renewal that fails
                // or is still not done a third later (a busy pool) closes the connection while
                // the lease still holds, so no other pod's connection ever overlaps this one.
                if lease.renew().await.is_err() {
                    break Ended::LostLease;
                }
            }
        }
    };
    // Events already being stored finish and are acked (a drain loses nothing and repeats
    // nothing it could avoid).
    if matches!(ended, Ended::Stopped | Ended::LostLease) {
        let deadline = tokio::time::sleep(Duration::from_secs(5));
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                _ = &mut deadline => break,
                next = inflight.next() => match next {
                    Some((frame, Handled::Done, ms)) => {
                        let _ = sink.send(Message::Binary(ack_frame(frame, 200, ms).into())).await;
                    }
                    Some(_) => {}
                    None => break,
                }
            }
        }
    }
    let _ = sink.send(Message::Close(None)).await;
    ended
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fragments_reassemble_in_any_order_and_are_bounded() {
        let mut f = Fragments::default();
        assert_eq!(f.add("a", 1, 0, b"x".to_vec(), 100), Some(b"x".to_vec()));
        assert_eq!(f.add("b", 3, 2, b"3".to_vec(), 100), None);
        assert_eq!(f.add("b", 3, 0, b"1".to_vec(), 100), None);
        assert_eq!(f.add("b", 3, 1, b"2".to_vec(), 100), Some(b"123".to_vec()));
        assert_eq!(f.add("c", 2, 5, b"x".to_vec(), 100), None);
        assert_eq!(f.add("d", 2, 0, vec![0; 80], 100), None);
        assert_eq!(f.add("e", 2, 0, vec![0; 30], 100), None, "over the bound");
    }
}
