//! The `[wechat]` configuration section and the provider's factory: what the edge's one
//! list of providers names.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use switchyard_core::provider::{Provider, ProviderFactory, ProviderServices, SharedSettings};
use switchyard_core::settings::{Dur, check_http_url};

use crate::{WechatConfig, WechatProvider};

/// `[wechat]`: what an operator sets (`SWITCHYARD_WECHAT__<KEY>` in the environment).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WechatSection {
    /// iLink bot API root (`{api_base}/ilink/bot/...`).
    pub api_base: String,
    /// Media CDN root (`{cdn_base}/upload`, `{cdn_base}/download`).
    pub cdn_base: String,
    /// Lifetime of a bot's poller lease (renewed every third of it): how long a dead pod's
    /// bots wait before another pod polls them.
    pub poll_lease_ttl: Dur,
    /// How often a pod that does not hold a bot's lease tries to take it.
    pub lease_retry: Dur,
    /// Hosts (and their subdomains) iLink may send a login or a bot to besides `api_base`'s
    /// host: a `scaned_but_redirect`'s `redirect_host`, a confirmation's `baseurl`.
    pub allowed_base_hosts: Vec<String>,
    /// How long a bot rests after iLink answered errcode -14 ("session timeout") before it is
    /// polled again with the same token; the channel shows `degraded` meanwhile.
    pub session_pause: Dur,
}

impl Default for WechatSection {
    fn default() -> Self {
        Self {
            api_base: "https://ilinkai.weixin.qq.com".into(),
            cdn_base: "https://novac2c.cdn.weixin.qq.com/c2c".into(),
            poll_lease_ttl: Dur(Duration::from_secs(15)),
            lease_retry: Dur(Duration::from_secs(2)),
            allowed_base_hosts: vec!["weixin.qq.com".into()],
            session_pause: Dur(Duration::from_secs(3600)),
        }
    }
}

/// The WeChat provider's entry in the edge's list of providers.
pub struct WechatFactory;

impl ProviderFactory for WechatFactory {
    type Section = WechatSection;
    const SECTION: &'static str = "wechat";
    const CARD_ID: &'static str = crate::CARD_ID;
    const PREFIX: &'static str = crate::PREFIX;
    const DEFAULT_TOML: &'static str = r#"[wechat]
# WeChat iLink bot API root: {base}/ilink/bot/... A bot's calls go to the baseurl its QR
# confirmation names when that is https (or this scheme) on this host or under
# allowed_base_hosts; otherwise (logged) to this.
api_base = "https://ilinkai.weixin.qq.com"
# WeChat media CDN root: {cdn}/upload, {cdn}/download (AES-128-ECB ciphertext).
cdn_base = "https://novac2c.cdn.weixin.qq.com/c2c"
# Lifetime of a bot's poller lease, renewed every third of it while the long poll waits: a
# killed pod's bots are polled by another pod within about this time.
poll_lease_ttl = "15s"
# How often a pod that does not hold a bot's lease tries to take it.
lease_retry = "2s"
# Hosts (and their subdomains) iLink may send a login or a bot to besides api_base's host:
# a scaned_but_redirect's redirect_host, a QR confirmation's baseurl. Any port.
allowed_base_hosts = ["weixin.qq.com"]
# How long a bot rests after iLink answered errcode -14 (session timeout) before it is
# polled again with the same token (the official client's hour); the channel shows degraded.
session_pause = "1h"
"#;

    fn validate(section: &WechatSection) -> Result<(), String> {
        check_http_url("wechat.api_base", &section.api_base)?;
        check_http_url("wechat.cdn_base", &section.cdn_base)
    }

    fn build(
        section: &WechatSection,
        shared: &SharedSettings,
        services: Arc<dyn ProviderServices>,
    ) -> Arc<dyn Provider> {
        let mut c = WechatConfig::new(shared.build.clone(), &section.api_base, &section.cdn_base);
        c.poll_lease_ttl = section.poll_lease_ttl.0;
        c.lease_retry = section.lease_retry.0;
        c.allowed_base_hosts = section.allowed_base_hosts.clone();
        c.session_pause = section.session_pause.0;
        Arc::new(WechatProvider::new(c, services))
    }

    fn describe_metrics() {
        crate::describe_metrics();
    }
}
