//! What the Telegram tests share: the fake Bot API server with its default bot and chats,
//! fast settings, and a [`Pod`] that binds through the form flow. The in-memory services, the
//! cluster state, the log capture and the waits come from `switchyard_core::testkit`.

#![allow(dead_code)] // each test binary uses a different part of the harness

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use switchyard_core::provider::AuthStep;
use switchyard_fake_telegram::FakeTelegram;
use switchyard_provider_telegram::{
    FLOW_BINDING, Mode, RateLimits, TelegramConfig, TelegramProvider,
};

pub use switchyard_core::testkit::*;

pub const TOKEN: &str = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw-test";
pub const BOT_ID: i64 = 123456789;
pub const CHAT: i64 = 555001;
pub const GROUP: i64 = -1001234567890;

/// Fast settings for tests: short polls and retries, generous limits unless a test sets them.
pub fn config(api_base: &str, mode: Mode) -> TelegramConfig {
    let mut c = TelegramConfig::new(build_info(), api_base);
    c.mode = mode;
    c.poll_timeout = Duration::from_secs(1);
    c.poll_lease_ttl = Duration::from_secs(3);
    c.lease_retry = Duration::from_millis(200);
    c.poll_error_backoff = Duration::from_millis(100);
    c.refresh_interval = Duration::from_millis(300);
    c.request_timeout = Duration::from_secs(3);
    c.transfer_timeout = Duration::from_secs(5);
    c.limits = RateLimits {
        per_bot_per_sec: 1000,
        per_chat_per_sec: 1000,
        per_group_per_min: 1000,
    };
    c.edit_interval = Duration::from_millis(300);
    c.send_budget = Duration::from_secs(10);
    c
}

/// A pod running the Telegram provider (its ingress served for webhook mode).
pub struct Pod(ProviderPod<TelegramProvider>);

impl std::ops::Deref for Pod {
    type Target = ProviderPod<TelegramProvider>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl Pod {
    /// A pod with ingress served on a real port (the services' public base URL points at it) and,
    /// when `run` is true, its background loops started.
    pub async fn start(cluster: Arc<Cluster>, name: &str, cfg: TelegramConfig, run: bool) -> Self {
        Self(
            ProviderPod::start(
                cluster,
                name,
                switchyard_provider_telegram::PREFIX,
                |services| TelegramProvider::new(cfg, services),
                run,
            )
            .await,
        )
    }

    /// Binds `channel_id` through the form flow and stores the binding as the core would.
    pub async fn bind(&self, channel_id: &str, token: &str, chat: Value) -> AuthStep {
        self.0
            .bind(FLOW_BINDING, channel_id, form(token, chat))
            .await
    }

    pub async fn auth(&self, channel_id: &str, token: &str, chat: Value) -> AuthStep {
        self.0
            .auth(FLOW_BINDING, channel_id, form(token, chat))
            .await
    }
}

fn form(token: &str, chat: Value) -> Value {
    json!({"bot_token": token, "chat_id": chat})
}

/// A fake server with the default bot, a private chat and a group.
pub async fn fake() -> FakeTelegram {
    let tg = FakeTelegram::start().await;
    tg.add_bot(TOKEN, "switchyard_test_bot");
    tg.add_chat(CHAT, "private", "Ada");
    tg.add_chat(GROUP, "supergroup", "Ops");
    tg
}
