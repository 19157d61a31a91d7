//! One `getupdates` long poll per bot across the cluster.
//!
//! Every pod runs a supervisor that reloads the bound bots periodically (and when a binding
//! is made or released here) and keeps a poller task per bot. Only the holder of the bot's
//! lease `poll:<bot_key>` calls `getupdates`; the others wait to take over (the kit's
//! [`Lease`], renewed while the long poll waits). The holder stores the whole batch, then
//! moves the durable cursor, and only
//! while it still holds the lease of the same generation (iLink's cursor is per batch: a
//! batch with a message that could not be stored is fetched again; what was stored is
//! de-duplicated by message id).
//!
//! errcode -14 ("session timeout") pauses a bot for `session_pause` (session-guard.ts and
//! monitor.ts: one hour, then the same token again): the pause is kept in the provider store
//! so a pod that takes the lease over keeps it, the channel shows `degraded` with the resume
//! time in its display name meanwhile, and sends are refused as retryable. No iLink answer
//! ends a binding (the official client drops an account only when a new login replaces it);
//! a logout does.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use switchyard_core::ProviderServices;
use switchyard_core::provider::{Binding, ProviderError};
use switchyard_protocol::ConnectionStatus;
use switchyard_provider_kit::{Consumers, Held, Lease, LeaseConfig, pause};
use tokio_util::sync::CancellationToken;

use switchyard_core::ids::now_ms;

use crate::creds::{Credentials, Peers, binding_key, peers_key};
use crate::ilink::ApiError;
use crate::inbound::{Handled, handle_message};
use crate::{Runtime, credentials};

/// A bound bot and the channel its messages go to.
#[derive(Clone)]
pub(crate) struct Bot {
    pub creds: Credentials,
    pub key: String,
    pub token_fp: String,
    pub channel_id: String,
}

fn pause_key(bot_key: &str) -> String {
    format!("pause:{bot_key}")
}

pub(crate) fn cursor_key(bot_key: &str) -> String {
    format!("cursor:{bot_key}")
}

/// The bound bots, one channel each (the oldest binding keeps a bot that is bound twice
/// across tenants).
async fn load(services: &dyn ProviderServices) -> Result<Vec<Bot>, ()> {
    let bindings = services.bound_channels().await.map_err(|e| {
        tracing::warn!(error = %e, "bound wechat bots not reloaded");
    })?;
    let mut bots: HashMap<String, Bot> = HashMap::new();
    for b in bindings {
        let Some(c) = Credentials::from_stored(&b.credentials) else {
            tracing::warn!(connector_channel_id = %b.channel_id, "wechat binding with unreadable credentials skipped");
            continue;
        };
        let fp = c.token_fp();
        let key = c.key();
        bots.entry(key.clone()).or_insert(Bot {
            key,
            token_fp: fp,
            channel_id: b.channel_id.clone(),
            creds: c,
        });
    }
    Ok(bots.into_values().collect())
}

/// The supervisor loop of one pod; ends (and stops its pollers) when `stop` is cancelled.
pub(crate) async fn supervise(
    rt: Arc<Runtime>,
    services: Arc<dyn ProviderServices>,
    stop: CancellationToken,
) {
    let mut pollers = Consumers::new(&stop);
    loop {
        if let Ok(bots) = load(services.as_ref()).await {
            metrics::gauge!("switchyard_wechat_bots").set(bots.len() as f64);
            let wanted = bots
                .iter()
                .map(|b| (b.key.clone(), b.token_fp.clone()))
                .collect();
            pollers.retain(&wanted);
            for b in bots {
                let (rt, services) = (rt.clone(), services.clone());
                let (key, fp) = (b.key.clone(), b.token_fp.clone());
                pollers.ensure(&key, &fp, move |stop| poll_bot(rt, services, b, stop));
            }
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(rt.cfg.refresh_interval) => {}
            _ = rt.kick.notified() => {}
        }
    }
    // Waiting lets each poller give its lease up, so another pod takes over at once.
    pollers.shutdown().await;
}

async fn notify(rt: &Runtime, bot: &Bot, start: bool) {
    let (ep, path) = if start {
        ("notifystart", "msg/notifystart")
    } else {
        ("notifystop", "msg/notifystop")
    };
    if let Err(e) = rt
        .api
        .bot(
            &bot.creds.base_url,
            &bot.creds.token,
            ep,
            path,
            json!({}),
            Some(Duration::from_secs(10)),
        )
        .await
    {
        tracing::debug!(bot_key = %bot.key, error = %e.summary(), "wechat notify call failed");
    }
}

/// `HH:MM UTC` of a time in ms.
pub(crate) fn until_text(until_ms: i64) -> String {
    let day_s = (until_ms / 1000).rem_euclid(86_400);
    format!("{:02}:{:02} UTC", day_s / 3600, day_s % 3600 / 60)
}

/// Until when (ms) iLink's pause of this bot lasts, when it is paused now.
pub(crate) async fn paused_until(services: &dyn ProviderServices, bot_key: &str) -> Option<i64> {
    services
        .kv_get(&pause_key(bot_key))
        .await
        .ok()
        .flatten()
        .and_then(|v| v.parse::<i64>().ok())
        .filter(|u| *u > now_ms())
}

/// Shows the pause (or, with None, its end) in the channel's display name, while the
/// channel still holds this bot's token.
async fn show_pause(services: &dyn ProviderServices, bot: &Bot, until: Option<i64>) {
    let Ok(Some(b)) = services.binding(&bot.channel_id).await else {
        return;
    };
    let Some(c) = Credentials::from_stored(&b.credentials) else {
        return;
    };
    if c.token_fp() != bot.token_fp {
        return;
    }
    let mut view = c.view();
    if let Some(u) = until {
        let t = until_text(u);
        view.display_name = format!(
            "{} (会话超时，暂停至 {t} / WeChat session timed out, paused until {t})",
            view.display_name
        );
    }
    if let Err(e) = services
        .rebind(
            &bot.channel_id,
            &b.credentials,
            &view,
            Some(&binding_key(&c.bot_id)),
        )
        .await
    {
        tracing::info!(connector_channel_id = %bot.channel_id, error = %e, "wechat pause not shown in the display name");
    }
}

/// iLink answered errcode -14: the bot rests for `session_pause` (cluster-wide), the channel
/// shows `degraded` with the resume time. Returns the end of the pause (ms).
pub(crate) async fn pause_bot(rt: &Runtime, services: &dyn ProviderServices, bot: &Bot) -> i64 {
    let until = now_ms() + rt.cfg.session_pause.as_millis() as i64;
    tracing::warn!(
        bot_key = %bot.key,
        pause_secs = rt.cfg.session_pause.as_secs(),
        "wechat paused the bot's session (errcode -14); it is polled again with the same token after the pause"
    );
    metrics::counter!("switchyard_wechat_session_pauses_total").increment(1);
    if let Err(e) = services
        .kv_put(&pause_key(&bot.key), &until.to_string())
        .await
    {
        tracing::warn!(error = %e, "wechat pause not stored");
    }
    // The name first: a rebind keeps the status it reads, the status move comes last.
    show_pause(services, bot, Some(until)).await;
    if let Err(e) = services
        .set_target_status(&bot.channel_id, ConnectionStatus::Degraded)
        .await
    {
        tracing::warn!(connector_channel_id = %bot.channel_id, error = %e, "channel not marked degraded");
    }
    until
}

/// The first good answer after a pause: the channel is connected again.
async fn resume_bot(services: &dyn ProviderServices, bot: &Bot) {
    tracing::info!(bot_key = %bot.key, "wechat bot resumed after its session pause");
    if let Err(e) = services.kv_put(&pause_key(&bot.key), "").await {
        tracing::warn!(error = %e, "wechat pause end not stored");
    }
    show_pause(services, bot, None).await;
    if let Err(e) = services
        .set_target_status(&bot.channel_id, ConnectionStatus::Connected)
        .await
    {
        tracing::warn!(connector_channel_id = %bot.channel_id, error = %e, "channel not marked connected");
    }
}

async fn poll_bot(
    rt: Arc<Runtime>,
    services: Arc<dyn ProviderServices>,
    bot: Bot,
    stop: CancellationToken,
) {
    let cfg = LeaseConfig {
        ttl: rt.cfg.poll_lease_ttl,
        retry: rt.cfg.lease_retry,
        backoff: rt.cfg.poll_error_backoff,
    };
    let mut lease = Lease::new(
        services.clone(),
        format!("poll:{}", bot.key),
        "wechat poller",
        cfg,
    );
    let cursor_k = cursor_key(&bot.key);
    let peers_k = peers_key(&bot.key);
    let backoff = rt.cfg.poll_error_backoff;
    let mut cursor = String::new();
    let mut peers = Peers::default();
    let mut failures = 0u32;
    let mut hold = rt.cfg.long_poll_timeout;
    // End of iLink's pause of this bot (ms), and whether the channel shows it.
    let mut paused_to = 0i64;
    let mut paused = false;
    while let Some(term) = lease.hold(&stop).await {
        if term.fresh {
            // A new term: the previous holder (maybe another pod) moved the cursor.
            let read = async {
                let c = services.kv_get(&cursor_k).await?;
                let p = services.kv_get(&peers_k).await?;
                let z = services.kv_get(&pause_key(&bot.key)).await?;
                Ok::<_, switchyard_core::BackendError>((c, p, z))
            };
            match read.await {
                Ok((c, p, z)) => {
                    // A pause another pod began (or this one before a restart).
                    if let Some(u) = z.and_then(|z| z.parse::<i64>().ok()) {
                        paused_to = u;
                        paused = true;
                    }
                    cursor = c.unwrap_or_default();
                    peers = p
                        .map(|p| Peers::open(&p, &bot.creds.token))
                        .unwrap_or_default();
                }
                Err(e) => {
                    tracing::warn!(bot_key = %bot.key, error = %e, "wechat cursor unreadable");
                    lease.forget();
                    if !pause(&stop, backoff).await {
                        break;
                    }
                    continue;
                }
            }
            notify(&rt, &bot, true).await;
        }
        // Paused: rest in steps, renewing the lease at the top of the loop, so another pod
        // does not poll the bot meanwhile.
        let left = paused_to - now_ms();
        if left > 0 {
            let step = Duration::from_millis(left as u64).min(lease.renew_every());
            if !pause(&stop, step).await {
                break;
            }
            continue;
        }
        // The lease is renewed while the long poll waits, so its TTL can be shorter than a
        // poll and a dead holder is replaced quickly.
        let call = rt.api.bot(
            &bot.creds.base_url,
            &bot.creds.token,
            "getupdates",
            "getupdates",
            json!({"get_updates_buf": cursor}),
            Some(hold + Duration::from_secs(10)),
        );
        let polled = match lease.run(&stop, call).await {
            Held::Done(r) => r,
            Held::Lost => continue,
            Held::Stopped => break,
        };
        let resp = match polled {
            Ok(v) => {
                failures = 0;
                if paused {
                    resume_bot(services.as_ref(), &bot).await;
                    paused = false;
                }
                v
            }
            Err(ApiError::SessionTimeout) => {
                paused_to = pause_bot(&rt, services.as_ref(), &bot).await;
                paused = true;
                continue;
            }
            Err(e) => {
                failures += 1;
                tracing::info!(bot_key = %bot.key, error = %e.summary(), failures, "wechat poll failed");
                let wait = if failures >= 3 { backoff * 15 } else { backoff };
                if !pause(&stop, wait).await {
                    break;
                }
                continue;
            }
        };
        if let Some(ms) = resp["longpolling_timeout_ms"].as_u64().filter(|m| *m > 0) {
            hold = Duration::from_millis(ms.min(120_000));
        }
        let next = resp["get_updates_buf"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let msgs = resp["msgs"].as_array().cloned().unwrap_or_default();
        let mut outcome = Handled::Done;
        let mut peers_changed = false;
        for m in &msgs {
            let (h, changed) = handle_message(&rt, services.as_ref(), &bot, &mut peers, m).await;
            peers_changed |= changed;
            if h != Handled::Done {
                outcome = h;
                break;
            }
        }
        if peers_changed
            && let Err(e) = services
                .kv_put(&peers_k, &peers.seal(&bot.creds.token))
                .await
        {
            tracing::warn!(bot_key = %bot.key, error = %e, "wechat reply tokens not stored; the batch is fetched again");
            outcome = Handled::Retry;
        }
        if outcome == Handled::Done && !next.is_empty() && next != cursor {
            // Fencing: only the holder of this term moves the cursor.
            if !lease.confirm().await {
                tracing::info!(bot_key = %bot.key, "wechat poller lost the lease during a batch");
                continue;
            }
            match services.kv_put(&cursor_k, &next).await {
                Ok(()) => cursor = next,
                Err(e) => {
                    tracing::warn!(bot_key = %bot.key, error = %e, "wechat cursor not stored; the batch is fetched again")
                }
            }
        }
        match outcome {
            Handled::Done => {}
            Handled::Paused => {
                paused_to = pause_bot(&rt, services.as_ref(), &bot).await;
                paused = true;
            }
            Handled::Gone => {
                rt.kick.notify_one();
                break;
            }
            Handled::Retry => {
                if !pause(&stop, backoff).await {
                    break;
                }
            }
        }
    }
    if lease.generation().is_some() {
        notify(&rt, &bot, false).await;
    }
    lease.release().await;
}

/// After a binding was made here: once the core stored it, wake the supervisor.
pub(crate) fn after_bind(
    rt: Arc<Runtime>,
    services: Arc<dyn ProviderServices>,
    channel_id: String,
    stored: Value,
) {
    let Some(want) = Credentials::from_stored(&stored) else {
        return;
    };
    tokio::spawn(async move {
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let bound = matches!(services.binding(&channel_id).await, Ok(Some(b))
                if Credentials::from_stored(&b.credentials).is_some_and(|c| c.token_fp() == want.token_fp()));
            if bound {
                rt.kick.notify_one();
                return;
            }
        }
    });
}

/// Logout: the poller stops (here at once; elsewhere at the next reload), the lease is given
/// up and the peers' reply tokens are forgotten.
pub(crate) async fn release(rt: Arc<Runtime>, binding: &Binding) -> Result<(), ProviderError> {
    let services = rt.services.clone();
    let c = credentials(binding)?;
    let key = c.key();
    let _ = services.kv_put(&peers_key(&key), "").await;
    if let Err(e) = services.release_lease(&format!("poll:{key}")).await {
        tracing::warn!(error = %e, "wechat poll lease not released");
    }
    let channel_id = binding.channel_id.clone();
    tokio::spawn(async move {
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if matches!(services.binding(&channel_id).await, Ok(None)) {
                break;
            }
        }
        rt.kick.notify_one();
    });
    Ok(())
}
