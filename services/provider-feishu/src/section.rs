//! The `[feishu]` configuration section and the provider's factory: what the edge's one
//! list of providers names.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use switchyard_core::provider::{Provider, ProviderFactory, ProviderServices, SharedSettings};
use switchyard_core::settings::{Dur, check_http_url};

use crate::{FeishuConfig, FeishuProvider};

/// `[feishu]`: what an operator sets (`SWITCHYARD_FEISHU__<KEY>` in the environment).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FeishuSection {
    /// Feishu Open Platform root (`{base}/open-apis/...`, the long-connection endpoint).
    pub api_base: String,
    /// The same for Lark (international) apps.
    pub lark_api_base: String,
    /// Feishu accounts host, for the one-click app registration of the QR flow
    /// (`{base}/oauth/v1/app/registration`).
    pub accounts_base: String,
    /// The same for Lark tenants.
    pub lark_accounts_base: String,
    /// Lifetime of an app's long-connection lease: how soon another pod takes over after
    /// the holder dies.
    pub lease_ttl: Dur,
    /// Longest an answer's turn keeps its reply target (the chat it started in) without a
    /// final or `idle`; an abandoned turn cannot pin the channel's answers to one chat longer.
    pub turn_ttl: Dur,
}

impl Default for FeishuSection {
    fn default() -> Self {
        Self {
            api_base: "https://open.feishu.cn".into(),
            lark_api_base: "https://open.larksuite.com".into(),
            accounts_base: "https://accounts.feishu.cn".into(),
            lark_accounts_base: "https://accounts.larksuite.com".into(),
            lease_ttl: Dur(Duration::from_secs(30)),
            turn_ttl: Dur(Duration::from_secs(600)),
        }
    }
}

/// The Feishu provider's entry in the edge's list of providers.
pub struct FeishuFactory;

impl ProviderFactory for FeishuFactory {
    type Section = FeishuSection;
    const SECTION: &'static str = "feishu";
    const CARD_ID: &'static str = crate::CARD_ID;
    const PREFIX: &'static str = crate::PREFIX;
    const DEFAULT_TOML: &'static str = r#"[feishu]
# Feishu Open Platform root: {base}/open-apis/..., the long-connection endpoint
# {base}/callback/ws/endpoint.
api_base = "https://open.feishu.cn"
# The same for Lark (international) apps (binding field domain = lark).
lark_api_base = "https://open.larksuite.com"
# Feishu accounts host, for the one-click app registration of the QR flow
# feishu_qr_create_app ({base}/oauth/v1/app/registration).
accounts_base = "https://accounts.feishu.cn"
# The same for Lark tenants (the registration moves there for a Lark user).
lark_accounts_base = "https://accounts.larksuite.com"
# Lifetime of an app's long-connection lease (one connection per app in the cluster): how
# soon another pod takes over after the holder dies.
lease_ttl = "30s"
# Longest an answer's turn keeps its reply target (the chat it started in) without a final
# or idle.
turn_ttl = "600s"
"#;

    fn validate(section: &FeishuSection) -> Result<(), String> {
        check_http_url("feishu.accounts_base", &section.accounts_base)?;
        check_http_url("feishu.lark_accounts_base", &section.lark_accounts_base)
    }

    fn build(
        section: &FeishuSection,
        shared: &SharedSettings,
        services: Arc<dyn ProviderServices>,
    ) -> Arc<dyn Provider> {
        let i = &shared.ingress;
        let mut c = FeishuConfig::new(
            shared.build.clone(),
            &section.api_base,
            &section.lark_api_base,
        );
        c.accounts_base = section.accounts_base.clone();
        c.lark_accounts_base = section.lark_accounts_base.clone();
        c.lease_ttl = section.lease_ttl.0;
        c.turn_ttl = section.turn_ttl.0;
        c.max_event_bytes = usize::try_from(i.max_json_bytes).unwrap_or(usize::MAX);
        c.http_body_timeout = i.body_timeout;
        c.http_body_grace = i.body_grace;
        c.http_min_body_rate = i.min_body_rate;
        c.max_http_concurrent = i.max_concurrent;
        c.max_http_concurrent_per_channel = i.max_concurrent_per_channel;
        Arc::new(FeishuProvider::new(c, services))
    }

    fn describe_metrics() {
        crate::describe_metrics();
    }
}
