//! One update stream per bot across the cluster.
//!
//! Every pod runs a supervisor that reloads the bound bots periodically (and when a binding
//! is made or released here). In webhook mode it registers each bot's webhook once (recorded
//! in the provider's key/value store, so pods do not repeat it). In polling mode it runs a
//! poller task per bot on every pod, but only the holder of the bot's lease `poll:<bot_key>`
//! calls `getUpdates`; the others wait to take over (the kit's [`Lease`], renewed while the
//! long poll waits). The holder moves the durable offset only after the batch is stored, and
//! only while it still holds the lease of the same generation.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use switchyard_core::ProviderServices;
use switchyard_core::crypto::sha256_hex;
use switchyard_core::provider::{Binding, ProviderError};
use switchyard_provider_kit::{Consumers, Held, Lease, LeaseConfig, pause};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::api::retrying;
use crate::bots::Bot;
use crate::creds::{Credentials, token_fingerprint, webhook_secret};
use crate::inbound::{Handled, handle_update};
use crate::{Mode, PREFIX, Runtime, credentials};

/// Edits are asked for: the Skill promises them as marked edits (see `inbound`).
const ALLOWED_UPDATES: [&str; 4] = [
    "message",
    "edited_message",
    "channel_post",
    "edited_channel_post",
];

/// The supervisor loop of one pod; ends (and stops its pollers) when `stop` is cancelled.
pub(crate) async fn supervise(
    rt: Arc<Runtime>,
    services: Arc<dyn ProviderServices>,
    stop: CancellationToken,
) {
    let mut pollers = Consumers::new(&stop);
    loop {
        reconcile(&rt, &services, Some(&mut pollers)).await;
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(rt.cfg.refresh_interval) => {}
            _ = rt.kick.notified() => {}
        }
    }
    pollers.shutdown().await;
}

/// One supervisor step: reload the bots, then make each one's update stream exist.
pub(crate) async fn reconcile(
    rt: &Arc<Runtime>,
    services: &Arc<dyn ProviderServices>,
    pollers: Option<&mut Consumers>,
) {
    if let Err(e) = rt
        .registry
        .refresh(services.as_ref(), &rt.revoked_set())
        .await
    {
        tracing::warn!(error = %e, "bound telegram bots not reloaded; retried at the next refresh");
        return;
    }
    let mode = rt.mode(services.as_ref());
    let mut wanted = HashMap::new();
    let mut live = Vec::new();
    for bot in rt.registry.all() {
        if rt.is_revoked(services.as_ref(), &bot.token_fp).await {
            continue;
        }
        wanted.insert(bot.key.clone(), bot.token_fp.clone());
        live.push(bot);
    }
    match (mode, pollers) {
        (Mode::Polling, Some(p)) => {
            p.retain(&wanted);
            for bot in &live {
                let (rt, services, bot) = (rt.clone(), services.clone(), bot.clone());
                p.ensure(&bot.key.clone(), &bot.token_fp.clone(), move |stop| {
                    poll_bot(rt, services, bot, stop)
                });
            }
        }
        (Mode::Polling, None) => {}
        (_, pollers) => {
            if let Some(p) = pollers {
                p.retain(&HashMap::new());
            }
            for bot in &live {
                ensure_webhook(rt, services.as_ref(), bot).await;
            }
        }
    }
    metrics::gauge!("switchyard_telegram_bots").set(live.len() as f64);
}

fn webhook_url(services: &dyn ProviderServices, bot: &Bot) -> String {
    format!(
        "{}{PREFIX}/updates/{}",
        services.public_base_url().trim_end_matches('/'),
        bot.key
    )
}

/// Registers the bot's webhook unless this URL and token are already registered.
async fn ensure_webhook(rt: &Runtime, services: &dyn ProviderServices, bot: &Bot) {
    let url = webhook_url(services, bot);
    // The update types are part of the registration: a webhook registered for fewer types
    // (before edits were asked for) is registered again.
    let fp =
        sha256_hex(format!("{url}\n{}\n{}", bot.token_fp, ALLOWED_UPDATES.join(",")).as_bytes())
            [..32]
            .to_owned();
    if rt
        .hooked
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&bot.key)
        == Some(&fp)
    {
        return;
    }
    let kv_key = format!("hook:{}", bot.key);
    if matches!(services.kv_get(&kv_key).await, Ok(Some(v)) if v == fp) {
        rt.hooked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(bot.key.clone(), fp);
        return;
    }
    let params = json!({
        "url": url,
        "secret_token": webhook_secret(&bot.token),
        "allowed_updates": ALLOWED_UPDATES,
        "max_connections": rt.cfg.webhook_max_connections,
    });
    // Recorded before the call: Telegram may deliver the first update to another pod before
    // this one could record the success, and that pod looks the record up to know the bot.
    // A pending record never equals the fingerprint, so a failed registration is retried.
    if let Err(e) = services.kv_put(&kv_key, &format!("pending:{fp}")).await {
        tracing::warn!(error = %e, "webhook registration not recorded; retried at the next refresh");
        return;
    }
    let deadline = Instant::now() + rt.cfg.request_timeout * 2;
    match retrying(deadline, true, || {
        rt.api
            .call::<Value>(&bot.token, "setWebhook", &params, None)
    })
    .await
    {
        Ok(_) => {
            tracing::info!(bot_key = %bot.key, "telegram webhook registered");
            if let Err(e) = services.kv_put(&kv_key, &fp).await {
                tracing::warn!(error = %e, "webhook registration not recorded; it is repeated later");
            }
            rt.hooked
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(bot.key.clone(), fp);
        }
        Err(e) if e.is_unauthorized() => rt.on_revoked(services, bot.id, &bot.token_fp).await,
        Err(e) => {
            tracing::warn!(bot_key = %bot.key, error = %e.summary(), "telegram webhook not registered; retried at the next refresh")
        }
    }
}

async fn poll_bot(
    rt: Arc<Runtime>,
    services: Arc<dyn ProviderServices>,
    bot: Arc<Bot>,
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
        "telegram poller",
        cfg,
    );
    let cursor = format!("offset:{}", bot.key);
    let backoff = rt.cfg.poll_error_backoff;
    let mut offset: i64 = 0;
    let mut failures = 0u32;
    while let Some(term) = lease.hold(&stop).await {
        if term.fresh {
            // A new term: the previous holder (maybe another pod) moved the cursor.
            offset = match services.kv_get(&cursor).await {
                Ok(v) => v.and_then(|s| s.parse().ok()).unwrap_or(0),
                Err(e) => {
                    tracing::warn!(bot_key = %bot.key, error = %e, "telegram cursor unreadable");
                    lease.forget();
                    if !pause(&stop, backoff).await {
                        break;
                    }
                    continue;
                }
            };
        }
        let params = json!({"offset": offset, "timeout": rt.cfg.poll_timeout.as_secs(), "allowed_updates": ALLOWED_UPDATES});
        let wait = rt.cfg.poll_timeout + rt.cfg.request_timeout;
        let polled = match lease
            .run(
                &stop,
                rt.api
                    .call::<Vec<Value>>(&bot.token, "getUpdates", &params, Some(wait)),
            )
            .await
        {
            Held::Done(r) => r,
            Held::Lost => continue,
            Held::Stopped => break,
        };
        let mut updates = match polled {
            Ok(u) => {
                failures = 0;
                u
            }
            Err(e) if e.is_unauthorized() => {
                rt.on_revoked(services.as_ref(), bot.id, &bot.token_fp)
                    .await;
                break;
            }
            Err(e) if e.is_webhook_conflict() => {
                // Switched from webhook to polling mode: the webhook must go for polls to work.
                tracing::info!(bot_key = %bot.key, "telegram webhook removed for polling");
                if let Err(e) = rt
                    .api
                    .call::<Value>(&bot.token, "deleteWebhook", &json!({}), None)
                    .await
                {
                    tracing::warn!(bot_key = %bot.key, error = %e.summary(), "telegram webhook not removed");
                }
                let _ = services.kv_put(&format!("hook:{}", bot.key), "").await;
                if !pause(&stop, backoff).await {
                    break;
                }
                continue;
            }
            Err(e) => {
                failures += 1;
                tracing::info!(bot_key = %bot.key, error = %e.summary(), failures, "telegram poll failed");
                let wait = if failures >= 3 { backoff * 15 } else { backoff };
                if !pause(&stop, wait).await {
                    break;
                }
                continue;
            }
        };
        updates.sort_by_key(|u| u.get("update_id").and_then(Value::as_i64).unwrap_or(0));
        let mut next = offset;
        let mut outcome = Handled::Done;
        for u in &updates {
            let Some(id) = u.get("update_id").and_then(Value::as_i64) else {
                continue;
            };
            if id < offset {
                continue;
            }
            outcome = handle_update(&rt, services.as_ref(), &bot, u).await;
            if outcome != Handled::Done {
                break;
            }
            next = id + 1;
        }
        if next > offset {
            // Fencing: only the holder of this term moves the cursor; a pod that lost the
            // lease mid-batch leaves it to the new holder (its stored updates are de-duplicated).
            if !lease.confirm().await {
                tracing::info!(bot_key = %bot.key, "telegram poller lost the lease during a batch");
                continue;
            }
            match services.kv_put(&cursor, &next.to_string()).await {
                Ok(()) => offset = next,
                Err(e) => {
                    tracing::warn!(bot_key = %bot.key, error = %e, "telegram cursor not stored; the batch is fetched again")
                }
            }
        }
        match outcome {
            Handled::Done => {}
            Handled::Revoked => {
                rt.on_revoked(services.as_ref(), bot.id, &bot.token_fp)
                    .await;
                break;
            }
            Handled::Retry => {
                if !pause(&stop, backoff).await {
                    break;
                }
            }
        }
    }
    lease.release().await;
}

/// After a binding was made here: once the core stored it, forget any cached webhook
/// registration of its bot (a release elsewhere may have removed it) and wake the supervisor.
pub(crate) fn after_bind(
    rt: Arc<Runtime>,
    services: Arc<dyn ProviderServices>,
    channel_id: String,
    stored: Value,
) {
    let Some(want) = Credentials::from_stored(&stored) else {
        return;
    };
    rt.hooked
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&want.bot_key());
    tokio::spawn(async move {
        let fp = token_fingerprint(&want.token);
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let bound = match services.binding(&channel_id).await {
                Ok(Some(b)) => Credentials::from_stored(&b.credentials).is_some_and(|c| {
                    c.bot_id == want.bot_id
                        && c.chat_id == want.chat_id
                        && token_fingerprint(&c.token) == fp
                }),
                _ => false,
            };
            if bound {
                rt.hooked
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&want.bot_key());
                rt.kick.notify_one();
                return;
            }
        }
    });
}

/// Logout or removal of a channel: when it was the bot's last channel, the update stream
/// stops (webhook deleted, lease given up); the supervisors stop their pollers once the core
/// cleared the binding.
pub(crate) async fn release(rt: Arc<Runtime>, binding: &Binding) -> Result<(), ProviderError> {
    let services = rt.services.clone();
    let creds = credentials(binding)?;
    let key = creds.bot_key();
    let others = match services.bound_channels().await {
        Ok(all) => all
            .iter()
            .filter(|b| b.channel_id != binding.channel_id)
            .filter_map(|b| Credentials::from_stored(&b.credentials))
            .any(|c| c.bot_id == creds.bot_id),
        Err(e) => {
            tracing::warn!(error = %e, "bound channels unavailable during release");
            return Err(ProviderError::transient(
                "storage is unavailable; retry later",
            ));
        }
    };
    if !others {
        match rt
            .api
            .call::<Value>(&creds.token, "deleteWebhook", &json!({}), None)
            .await
        {
            Ok(_) => {
                tracing::info!(bot_key = %key, "last channel of a telegram bot released; update stream stopped")
            }
            Err(e) if e.is_unauthorized() => {}
            Err(e) => {
                tracing::warn!(bot_key = %key, error = %e.summary(), "telegram webhook not deleted")
            }
        }
        rt.hooked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key);
        if let Err(e) = services.kv_put(&format!("hook:{key}"), "").await {
            tracing::warn!(error = %e, "webhook record not cleared");
        }
        if let Err(e) = services.release_lease(&format!("poll:{key}")).await {
            tracing::warn!(error = %e, "telegram poll lease not released");
        }
    }
    let channel_id = binding.channel_id.clone();
    tokio::spawn(async move {
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if matches!(services.binding(&channel_id).await, Ok(None)) {
                break;
            }
        }
        rt.kick.notify_one();
    });
    Ok(())
}
