//! The `[telegram]` configuration section and the provider's factory: what the edge's one
//! list of providers names.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use switchyard_core::provider::{Provider, ProviderFactory, ProviderServices, SharedSettings};

use crate::{Mode, TelegramConfig, TelegramProvider};

/// `[telegram]`: what an operator sets (`SWITCHYARD_TELEGRAM__<KEY>` in the environment).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelegramSection {
    /// Bot API root: `{base}/bot{token}/{method}`, files at `{base}/file/bot{token}/{path}`.
    pub api_base: String,
    /// How updates arrive; anything else is refused at load, naming the allowed values.
    pub mode: TelegramMode,
}

impl Default for TelegramSection {
    fn default() -> Self {
        Self {
            api_base: "https://api.telegram.org".into(),
            mode: TelegramMode::Auto,
        }
    }
}

/// `telegram.mode` (its variants in this order name the allowed values in a refusal).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TelegramMode {
    /// Webhook when public_base_url is https, else long polling.
    Auto,
    Webhook,
    Polling,
}

impl From<TelegramMode> for Mode {
    fn from(m: TelegramMode) -> Self {
        match m {
            TelegramMode::Auto => Mode::Auto,
            TelegramMode::Webhook => Mode::Webhook,
            TelegramMode::Polling => Mode::Polling,
        }
    }
}

/// The Telegram provider's entry in the edge's list of providers.
pub struct TelegramFactory;

impl ProviderFactory for TelegramFactory {
    type Section = TelegramSection;
    const SECTION: &'static str = "telegram";
    const CARD_ID: &'static str = crate::CARD_ID;
    const PREFIX: &'static str = crate::PREFIX;
    const DEFAULT_TOML: &'static str = r#"[telegram]
# Telegram Bot API root: {base}/bot{token}/{method}, files at {base}/file/bot{token}/{path}.
api_base = "https://api.telegram.org"
# How updates arrive: auto (webhook when public_base_url is https, else long polling),
# webhook (registered at public_base_url/telegram/updates/...) or polling (one poller per
# bot across the cluster).
mode = "auto"
"#;

    fn build(
        section: &TelegramSection,
        shared: &SharedSettings,
        services: Arc<dyn ProviderServices>,
    ) -> Arc<dyn Provider> {
        let mut c = TelegramConfig::new(shared.build.clone(), &section.api_base);
        c.max_webhook_bytes = shared.ingress.max_json_bytes;
        c.webhook_body_timeout = shared.ingress.body_timeout;
        c.max_webhook_concurrent = shared.ingress.max_concurrent;
        c.mode = section.mode.into();
        Arc::new(TelegramProvider::new(c, services))
    }

    fn describe_metrics() {
        crate::describe_metrics();
    }
}
