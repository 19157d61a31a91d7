//! The one list of providers this build mounts: each IM provider crate's factory, one line
//! each (the crate owns its settings section, defaults, validation and metrics), plus the
//! two providers the edge wires itself (the generic webhook, built from the shared settings
//! only, and the agent-host connector, which serves the hosts gateway). Each is built with
//! its Card's services, made first ([`CardServices`]).

use std::sync::Arc;
use std::time::Duration;

use switchyard_core::engine::{CardServices, Hub, MountedCard};
use switchyard_core::hosts::Hosts;
use switchyard_core::provider::{Provider, ProviderServices};

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

/// Makes the services of Card `card_id` under `prefix`, builds its provider with them and
/// mounts it.
fn mount(
    hub: &Arc<Hub>,
    card_id: &str,
    prefix: &'static str,
    build: impl FnOnce(Arc<dyn ProviderServices>) -> Arc<dyn Provider>,
) -> MountedCard {
    let services = CardServices::new(hub.clone(), card_id, prefix);
    let provider = build(services.clone());
    MountedCard::mount(services, provider)
}

/// The providers this build mounts, each on its services; `gateway` is what the agent-host
/// connector serves for hosts next to its own routes.
pub fn connectors(
    cfg: &Config,
    hub: &Arc<Hub>,
    hosts: Arc<Hosts>,
    gateway: axum::Router,
) -> Vec<MountedCard> {
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
    let mut out = vec![mount(
        hub,
        switchyard_provider_webhook::CARD_ID,
        switchyard_provider_webhook::PREFIX,
        |services| {
            Arc::new(switchyard_provider_webhook::WebhookProvider::new(
                wh, services,
            ))
        },
    )];
    out.extend(cfg.providers.sections().map(|section| {
        mount(hub, section.card_id(), section.prefix(), |services| {
            section.build(&shared, services)
        })
    }));
    // A wait ends before the engine's tool timeout cuts it.
    let max_wait = cfg
        .limits
        .tool_timeout
        .0
        .saturating_sub(Duration::from_secs(5))
        .max(Duration::from_secs(1));
    out.push(mount(
        hub,
        switchyard_provider_agent_host::CARD_ID,
        AGENT_HOST_PREFIX,
        |services| {
            Arc::new(
                switchyard_provider_agent_host::AgentHostProvider::new(
                    build_info(),
                    true,
                    hosts,
                    max_wait,
                    services,
                )
                .with_gateway(gateway),
            )
        },
    ));
    out
}
