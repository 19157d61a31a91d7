//! Push delivery after `setWebhook`: the bot's queued updates are POSTed to its URL one at a
//! time, in order, each retried with a growing pause until the receiver answers 2xx.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::{Shared, now_secs};

const SECRET_HEADER: &str = "X-Telegram-Bot-Api-Secret-Token";
const MAX_BACKOFF: Duration = Duration::from_secs(1);

pub(crate) async fn deliver(s: Arc<Shared>, token: String) {
    let mut backoff = Duration::from_millis(50);
    loop {
        let notify = match s.lock().bots.get(&token) {
            Some(bot) => bot.notify.clone(),
            None => return,
        };
        let notified = notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let next = {
            let inner = s.lock();
            let Some(bot) = inner.bots.get(&token) else {
                return;
            };
            let Some(w) = &bot.webhook else { return };
            bot.queue
                .front()
                .map(|u| (u.clone(), w.url.clone(), w.secret.clone()))
        };
        let Some((update, url, secret)) = next else {
            let _ = tokio::time::timeout(Duration::from_secs(1), notified).await;
            continue;
        };
        let mut req = s.http.post(&url).json(&update);
        if let Some(sec) = &secret {
            req = req.header(SECRET_HEADER, sec);
        }
        let failure = match req.send().await {
            Ok(r) if r.status().is_success() => None,
            Ok(r) => Some(format!(
                "Wrong response from the webhook: {} {}",
                r.status().as_u16(),
                r.status().canonical_reason().unwrap_or("")
            )),
            Err(e) if e.is_timeout() => Some("Read timeout expired".to_owned()),
            Err(_) => Some("Connection refused".to_owned()),
        };
        let id = update.get("update_id").and_then(Value::as_i64);
        {
            let mut inner = s.lock();
            let Some(bot) = inner.bots.get_mut(&token) else {
                return;
            };
            let Some(w) = bot.webhook.as_mut() else {
                return;
            };
            match &failure {
                None => {
                    w.deliveries += 1;
                    bot.queue
                        .retain(|u| u.get("update_id").and_then(Value::as_i64) != id);
                }
                Some(e) => w.last_error = Some((now_secs(), e.clone())),
            }
        }
        if failure.is_some() {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        } else {
            backoff = Duration::from_millis(50);
        }
    }
}
