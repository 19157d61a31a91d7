//! The `[slack]` configuration section and the provider's factory: what the edge's one list
//! of providers names.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use switchyard_core::provider::{Provider, ProviderFactory, ProviderServices, SharedSettings};
use switchyard_core::settings::{Dur, check_http_url};

use crate::{SlackConfig, SlackProvider};

/// `[slack]`: what an operator sets (`SWITCHYARD_SLACK__<KEY>` in the environment).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SlackSection {
    /// Slack Web API root: `POST {base}/{method}`. Socket Mode and upload URLs come from
    /// the API's own answers.
    pub api_base: String,
    /// Lifetime of an app's Socket Mode lease (one connection per app in the cluster): how
    /// soon another pod takes over after the holder dies.
    pub lease_ttl: Dur,
    /// Longest an answer's turn keeps its target conversation without a final or `idle`.
    pub turn_ttl: Dur,
}

impl Default for SlackSection {
    fn default() -> Self {
        Self {
            api_base: "https://slack.com/api".into(),
            lease_ttl: Dur(Duration::from_secs(30)),
            turn_ttl: Dur(Duration::from_secs(600)),
        }
    }
}

/// The Slack provider's entry in the edge's list of providers.
pub struct SlackFactory;

impl ProviderFactory for SlackFactory {
    type Section = SlackSection;
    const SECTION: &'static str = "slack";
    const CARD_ID: &'static str = crate::CARD_ID;
    const PREFIX: &'static str = crate::PREFIX;
    const DEFAULT_TOML: &'static str = r#"[slack]
# Slack Web API root: POST {base}/{method} ({base}/chat.postMessage,
# {base}/apps.connections.open, ...). Socket Mode and upload URLs come from the API's answers.
api_base = "https://slack.com/api"
# Lifetime of an app's Socket Mode lease (one connection per app in the cluster): how soon
# another pod takes over after the holder dies.
lease_ttl = "30s"
# Longest an answer's turn keeps its target conversation without a final or idle.
turn_ttl = "600s"
"#;

    fn validate(section: &SlackSection) -> Result<(), String> {
        check_http_url("slack.api_base", &section.api_base)
    }

    fn build(
        section: &SlackSection,
        shared: &SharedSettings,
        services: Arc<dyn ProviderServices>,
    ) -> Arc<dyn Provider> {
        let mut c = SlackConfig::new(shared.build.clone(), &section.api_base);
        c.lease_ttl = section.lease_ttl.0;
        c.turn_ttl = section.turn_ttl.0;
        c.max_event_bytes = usize::try_from(shared.ingress.max_json_bytes).unwrap_or(usize::MAX);
        c.http_body_timeout = shared.ingress.body_timeout;
        c.max_http_concurrent = shared.ingress.max_concurrent;
        c.max_http_concurrent_per_channel = shared.ingress.max_concurrent_per_channel;
        Arc::new(SlackProvider::new(c, services))
    }
}
