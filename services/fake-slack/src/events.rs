//! Event delivery: every unacknowledged event of an app goes to one of its Socket Mode
//! connections, or by HTTP to its Request URL, and again after each retry delay until it is
//! acknowledged or its three retries are spent (docs.slack.dev "The Events API", "Retries").

use std::sync::Arc;
use std::time::Duration;

use hmac::{Hmac, Mac};
use serde_json::json;
use sha2::Sha256;
use tokio::time::Instant;

use crate::{App, Delivery, Inner, WsOut};

/// Acknowledged bodies kept for [`crate::FakeSlack::repeat_event`].
const HISTORY: usize = 10_000;

/// `v0=hex(HMAC-SHA256(secret, "v0:{ts}:{body}"))` (python-slack-sdk
/// `slack_sdk/signature/__init__.py` `generate_signature`).
pub fn signature(secret: &str, ts: &str, body: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("any key length");
    mac.update(format!("v0:{ts}:{body}").as_bytes());
    format!("v0={}", hex::encode(mac.finalize().into_bytes()))
}

pub(crate) async fn post_signed(
    http: &reqwest::Client,
    url: &str,
    secret: &str,
    body: &str,
    retry: Option<(u32, &str)>,
) -> reqwest::Result<reqwest::Response> {
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
        .to_string();
    let mut req = http
        .post(url)
        .header("content-type", "application/json")
        .header("x-slack-request-timestamp", &ts)
        .header("x-slack-signature", signature(secret, &ts, body))
        .body(body.to_owned());
    if let Some((n, reason)) = retry {
        req = req
            .header("x-slack-retry-num", n.to_string())
            .header("x-slack-retry-reason", reason);
    }
    req.send().await
}

impl App {
    /// The event was acknowledged: it leaves the queue, its body stays for repeats.
    pub(crate) fn settle(&mut self, envelope_or_event: &str, by_envelope: bool) -> bool {
        let at = self.pending.iter().position(|e| {
            if by_envelope {
                e.envelope_id == envelope_or_event
            } else {
                e.event_id == envelope_or_event
            }
        });
        let Some(at) = at else { return false };
        let Some(e) = self.pending.remove(at) else {
            return false;
        };
        self.acked += 1;
        self.history.push_back((e.event_id, e.payload));
        while self.history.len() > HISTORY {
            self.history.pop_front();
        }
        true
    }
}

/// Whether an event sent `attempts` times, last at `sent_at`, is due again now; None when
/// its retries are spent.
fn due(attempts: u32, sent_at: Option<Instant>, delays: &[Duration], now: Instant) -> Option<bool> {
    let Some(at) = sent_at else { return Some(true) };
    let i = attempts.saturating_sub(1) as usize;
    let wait = *delays.get(i).or(delays.last())?;
    if now.duration_since(at) < wait {
        return Some(false);
    }
    (i < delays.len()).then_some(true)
}

pub(crate) async fn dispatch(inner: Arc<Inner>) {
    loop {
        tokio::select! {
            _ = inner.wake.notified() => {}
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
        let delays = inner
            .retry_delays
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let now = Instant::now();
        let mut posts = Vec::new();
        {
            let mut st = inner.lock();
            for app in st.apps.values_mut() {
                if app.revoked {
                    continue;
                }
                let http = app.events_url.clone();
                if http.is_none() && app.conns.is_empty() {
                    continue;
                }
                let mut give_up = Vec::new();
                let conn_ids: Vec<u64> = {
                    let mut ids: Vec<u64> = app.conns.keys().copied().collect();
                    ids.sort_unstable();
                    ids
                };
                for i in 0..app.pending.len() {
                    let e = &app.pending[i];
                    if e.in_flight {
                        continue;
                    }
                    match due(e.attempts, e.sent_at, &delays, now) {
                        None => {
                            give_up.push(e.event_id.clone());
                            continue;
                        }
                        Some(false) => continue,
                        Some(true) => {}
                    }
                    let retry = e.attempts;
                    match &http {
                        Some(url) => {
                            let e = &mut app.pending[i];
                            e.in_flight = true;
                            posts.push((
                                app.spec.app_id.clone(),
                                url.clone(),
                                app.spec.signing_secret.clone(),
                                e.event_id.clone(),
                                e.payload.to_string(),
                                retry,
                            ));
                        }
                        None => {
                            let pick = conn_ids[app.round_robin % conn_ids.len()];
                            app.round_robin = app.round_robin.wrapping_add(1);
                            let e = &app.pending[i];
                            let msg = json!({
                                "envelope_id": e.envelope_id, "payload": e.payload,
                                "type": "events_api", "accepts_response_payload": false,
                                "retry_attempt": retry,
                                "retry_reason": if retry > 0 { "timeout" } else { "" },
                            })
                            .to_string();
                            if let Some(c) = app.conns.get(&pick) {
                                let _ = c.send(WsOut::Text(msg));
                            }
                            let e = &mut app.pending[i];
                            e.attempts += 1;
                            e.sent_at = Some(now);
                        }
                    }
                }
                for id in give_up {
                    app.pending.retain(|e| e.event_id != id || e.in_flight);
                    app.dropped.push(id);
                }
            }
        }
        for (app_id, url, secret, event_id, body, retry) in posts {
            let inner = inner.clone();
            tokio::spawn(async move {
                let reason = if retry > 0 {
                    Some((retry, "http_error"))
                } else {
                    None
                };
                let answered = tokio::time::timeout(
                    inner.http_timeout,
                    post_signed(&inner.http, &url, &secret, &body, reason),
                )
                .await;
                let status = match answered {
                    Ok(Ok(r)) => Some(r.status().as_u16()),
                    _ => None,
                };
                let mut st = inner.lock();
                let Some(app) = st.apps.get_mut(&app_id) else {
                    return;
                };
                app.deliveries.push(Delivery {
                    event_id: event_id.clone(),
                    retry_num: retry,
                    status,
                });
                if status.is_some_and(|s| (200..300).contains(&s)) {
                    app.settle(&event_id, false);
                } else if let Some(e) = app
                    .pending
                    .iter_mut()
                    .find(|e| e.event_id == event_id && e.in_flight)
                {
                    e.in_flight = false;
                    e.attempts += 1;
                    e.sent_at = Some(Instant::now());
                }
            });
        }
    }
}
