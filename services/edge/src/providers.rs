//! The one list of providers this build mounts: each IM provider crate's factory, one line
//! each (the crate owns its settings section, defaults, validation and metrics), plus the
//! two providers the edge wires itself (the generic webhook, built from the shared settings
//! only, and the agent-host connector, which serves the hosts gateway).

use std::sync::Arc;
use std::time::Duration;

use switchyard_core::hosts::Hosts;
use switchyard_core::provider::Provider;

use crate::config::{Config, SectionFactory};

/// The agent-host connector's route prefix (its mTLS listener mounts the same routes).
pub use switchyard_provider_agent_host::PREFIX as AGENT_HOST_PREFIX;

/// The provider factories whose sections the configuration loads, in mount order; each line
/// is behind its cargo feature (all on by default).
pub fn factories() -> Vec<Box<dyn SectionFactory>> {
    // Unused in a build with every provider feature off.
    #[allow(unused_imports)]
    use crate::config::factory;
    vec![
        #[cfg(feature = "telegram")]
        factory::<switchyard_provider_telegram::TelegramFactory>(),
        #[cfg(feature = "wechat")]
        factory::<switchyard_provider_wechat::WechatFactory>(),
        #[cfg(feature = "feishu")]
        factory::<switchyard_provider_feishu::FeishuFactory>(),
        #[cfg(feature = "discord")]
        factory::<switchyard_provider_discord::DiscordFactory>(),
        #[cfg(feature = "slack")]
        factory::<switchyard_provider_slack::SlackFactory>(),
    ]
}

/// Describes and registers every listed provider's metric families at zero.
pub fn describe_metrics() {
    for f in factories() {
        f.describe_metrics();
    }
}

/// The providers this build mounts; `gateway` is what the agent-host connector serves for
/// hosts next to its own routes.
pub fn providers(cfg: &Config, hosts: Arc<Hosts>, gateway: axum::Router) -> Vec<Arc<dyn Provider>> {
    let build_info = crate::app::build_info;
    let shared = cfg.shared_settings(build_info());
    let mut wh = switchyard_provider_webhook::WebhookConfig::new(build_info(), true);
    wh.max_inbound_bytes = shared.max_inbound_bytes;
    wh.max_inbound_json_bytes = shared.ingress.max_json_bytes;
    wh.inbound_body_timeout = shared.ingress.body_timeout;
    wh.inbound_body_grace = shared.ingress.body_grace;
    wh.inbound_min_body_rate = shared.ingress.min_body_rate;
    wh.max_inbound_concurrent = shared.ingress.max_concurrent;
    wh.max_inbound_concurrent_per_tenant = shared.ingress.max_concurrent_per_tenant;
    wh.max_inbound_concurrent_per_channel = shared.ingress.max_concurrent_per_channel;
    wh.outbound = shared.outbound.clone();
    let mut out: Vec<Arc<dyn Provider>> = vec![Arc::new(
        switchyard_provider_webhook::WebhookProvider::new(wh),
    )];
    out.extend(cfg.providers.build(&shared));
    out.push(Arc::new(
        switchyard_provider_agent_host::AgentHostProvider::new(
            build_info(),
            true,
            hosts,
            // A wait ends before the engine's tool timeout cuts it.
            cfg.limits
                .tool_timeout
                .0
                .saturating_sub(Duration::from_secs(5))
                .max(Duration::from_secs(1)),
        )
        .with_gateway(gateway),
    ));
    out
}
