//! The `[discord]` configuration section and the provider's factory: what the edge's one
//! list of providers names.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use switchyard_core::provider::{Provider, ProviderFactory, ProviderServices, SharedSettings};
use switchyard_core::settings::{Dur, check_http_url};

use crate::{DiscordConfig, DiscordProvider};

/// `[discord]`: what an operator sets (`SWITCHYARD_DISCORD__<KEY>` in the environment).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DiscordSection {
    /// Discord REST root (`{base}/channels/{id}/messages`, ...); the Gateway URL comes from
    /// `GET {base}/gateway/bot`.
    pub api_base: String,
    /// Lifetime of a bot's Gateway lease (one session per bot in the cluster): how soon
    /// another pod takes the session over (and resumes it) after the holder dies.
    pub lease_ttl: Dur,
    /// Longest an answer's turn keeps its target channel without a final or `idle`.
    pub turn_ttl: Dur,
}

impl Default for DiscordSection {
    fn default() -> Self {
        Self {
            api_base: "https://discord.com/api/v10".into(),
            lease_ttl: Dur(Duration::from_secs(30)),
            turn_ttl: Dur(Duration::from_secs(600)),
        }
    }
}

/// The Discord provider's entry in the edge's list of providers.
pub struct DiscordFactory;

impl ProviderFactory for DiscordFactory {
    type Section = DiscordSection;
    const SECTION: &'static str = "discord";
    const CARD_ID: &'static str = crate::CARD_ID;
    const PREFIX: &'static str = crate::PREFIX;
    const DEFAULT_TOML: &'static str = r#"[discord]
# Discord REST root: {base}/channels/{id}/messages, ...; the Gateway URL comes from
# GET {base}/gateway/bot.
api_base = "https://discord.com/api/v10"
# Lifetime of a bot's Gateway lease (one session per bot in the cluster): how soon another
# pod takes the session over (and resumes it) after the holder dies.
lease_ttl = "30s"
# Longest an answer's turn keeps its target channel without a final or idle.
turn_ttl = "600s"
"#;

    fn validate(section: &DiscordSection) -> Result<(), String> {
        check_http_url("discord.api_base", &section.api_base)
    }

    fn build(
        section: &DiscordSection,
        shared: &SharedSettings,
        services: Arc<dyn ProviderServices>,
    ) -> Arc<dyn Provider> {
        let mut c = DiscordConfig::new(shared.build.clone(), &section.api_base);
        c.lease_ttl = section.lease_ttl.0;
        c.turn_ttl = section.turn_ttl.0;
        Arc::new(DiscordProvider::new(c, services))
    }
}
