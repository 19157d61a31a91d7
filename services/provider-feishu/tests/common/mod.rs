//! What the Feishu tests share: the fake Open Platform with its default app, fast settings,
//! and a [`Pod`] that binds through the form flow or the QR app-creation flow. The in-memory
//! services, the cluster state (auth sessions included), the log capture and the waits come from
//! `switchyard_core::testkit`.

#![allow(dead_code)] // each test binary uses a different part of the harness

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use switchyard_core::provider::AuthStep;
use switchyard_fake_feishu::FakeFeishu;
use switchyard_provider_feishu::{
    FLOW_APP_BINDING, FLOW_QR_CREATE_APP, FeishuConfig, FeishuProvider,
};

pub use switchyard_core::testkit::*;

pub const APP: &str = "cli_a1b2c3d4e5f60001";
pub const SECRET: &str = "AppSecretValueForTests0123456789";
pub const USER: &str = "ou_user_ada";
pub const GROUP: &str = "oc_group_ops";

/// Fast settings for tests.
pub fn config(api_base: &str) -> FeishuConfig {
    let mut c = FeishuConfig::new(build_info(), api_base, api_base);
    c.accounts_base = api_base.to_owned();
    c.lark_accounts_base = api_base.to_owned();
    c.lease_ttl = Duration::from_millis(1500);
    c.lease_retry = Duration::from_millis(200);
    c.reconnect_backoff = Duration::from_millis(100);
    c.max_reconnect_backoff = Duration::from_millis(500);
    c.refresh_interval = Duration::from_millis(300);
    c.request_timeout = Duration::from_secs(3);
    c.transfer_timeout = Duration::from_secs(5);
    c.edit_interval = Duration::from_millis(200);
    c.send_budget = Duration::from_secs(10);
    c
}

/// A pod running the Feishu provider, its ingress served on a real port and, when `run` is
/// true, its background loops (the long connections) started.
pub struct Pod(ProviderPod<FeishuProvider>);

impl std::ops::Deref for Pod {
    type Target = ProviderPod<FeishuProvider>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl Pod {
    pub async fn start(cluster: Arc<Cluster>, name: &str, cfg: FeishuConfig, run: bool) -> Self {
        Self(
            ProviderPod::start(
                cluster,
                name,
                switchyard_provider_feishu::PREFIX,
                |services| FeishuProvider::new(cfg, services),
                run,
            )
            .await,
        )
    }

    /// Binds `channel_id` through the form flow and stores the binding as the core would.
    pub async fn bind(&self, channel_id: &str, fields: Value) -> AuthStep {
        self.0.bind(FLOW_APP_BINDING, channel_id, fields).await
    }

    pub async fn auth(&self, channel_id: &str, fields: Value) -> AuthStep {
        self.0.auth(FLOW_APP_BINDING, channel_id, fields).await
    }

    /// `auth.start` of the QR flow as the core runs it: the session exists first, the step
    /// is applied after.
    pub async fn qr_start(&self, channel_id: &str, session_id: &str) -> AuthStep {
        self.session_start(FLOW_QR_CREATE_APP, channel_id, session_id, json!({}))
            .await
    }

    /// `auth.status` as the core runs it (terminal sessions are not polled); returns the
    /// session afterwards.
    pub async fn qr_status(&self, session_id: &str, refresh: bool) -> AuthSession {
        self.session_poll(FLOW_QR_CREATE_APP, session_id, refresh)
            .await
    }

    /// Waits until the session shows its QR code; returns the session.
    pub async fn qr_shown(&self, session_id: &str) -> AuthSession {
        eventually(WAIT, "QR in the session", || async {
            let s = self.services.cluster.session(session_id);
            s.qr_code_text.is_some().then_some(s)
        })
        .await
    }
}

/// A fake Open Platform with the default app.
pub async fn fake() -> FakeFeishu {
    let fs = FakeFeishu::start().await;
    fs.add_app(APP, SECRET, "Switchyard Test Bot");
    fs
}

pub fn app_fields() -> Value {
    json!({"app_id": APP, "app_secret": SECRET})
}
