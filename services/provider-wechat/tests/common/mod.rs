//! What the WeChat tests share: fast settings and a [`Pod`] that logs in through the QR flow
//! against the fake iLink server. The in-memory services, the cluster state (auth sessions
//! included), the log capture and the waits come from `switchyard_core::testkit`.

#![allow(dead_code)] // each test binary uses a different part of the harness

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use switchyard_core::model::AuthStatus;
use switchyard_core::provider::AuthStep;
use switchyard_fake_wechat::FakeWechat;
use switchyard_provider_wechat::{FLOW_QR, WechatConfig, WechatProvider};

pub use switchyard_core::testkit::*;

/// Fast settings for tests; the fake holds a `wait` QR status for half a second only.
pub fn config(fake: &FakeWechat) -> WechatConfig {
    fake.set_qr_hold(Duration::from_millis(500));
    let mut c = WechatConfig::new(build_info(), &fake.base_url(), &fake.cdn_base());
    c.poll_lease_ttl = Duration::from_secs(3);
    c.lease_retry = Duration::from_millis(200);
    c.poll_error_backoff = Duration::from_millis(100);
    c.long_poll_timeout = Duration::from_secs(2);
    c.refresh_interval = Duration::from_millis(300);
    c.request_timeout = Duration::from_secs(3);
    c.qr_status_timeout = Duration::from_secs(2);
    c.transfer_timeout = Duration::from_secs(5);
    c.send_per_bot_per_sec = 1000;
    c.send_budget = Duration::from_secs(10);
    c.typing_every = Duration::from_millis(200);
    c
}

/// A pod running the WeChat provider; when `run` is true its pollers run.
pub struct Pod(ProviderPod<WechatProvider>);

impl std::ops::Deref for Pod {
    type Target = ProviderPod<WechatProvider>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl Pod {
    pub async fn start(cluster: Arc<Cluster>, name: &str, cfg: WechatConfig, run: bool) -> Self {
        Self(
            ProviderPod::start(
                cluster,
                name,
                switchyard_provider_wechat::PREFIX,
                |services| WechatProvider::new(cfg, services),
                run,
            )
            .await,
        )
    }

    /// `auth.start` as the core runs it: the session exists first, the step is applied after.
    pub async fn auth_start(&self, channel_id: &str, session_id: &str) -> AuthStep {
        self.session_start(FLOW_QR, channel_id, session_id, json!({}))
            .await
    }

    /// `auth.status` as the core runs it; returns the session afterwards.
    pub async fn auth_status(&self, session_id: &str, refresh: bool) -> AuthSession {
        self.session_poll(FLOW_QR, session_id, refresh).await
    }

    /// Full QR login of `channel_id`; returns the bot the fake created.
    pub async fn login(
        &self,
        fake: &FakeWechat,
        channel_id: &str,
    ) -> switchyard_fake_wechat::ConfirmedBot {
        let sid = format!("auth_{channel_id}");
        self.auth_start(channel_id, &sid).await;
        eventually(WAIT, "QR code", || async {
            self.services
                .cluster
                .session(&sid)
                .qr_code_text
                .is_some()
                .then_some(())
        })
        .await;
        let code = fake.qr_codes().last().cloned().expect("qr");
        let bot = fake.confirm(&code).expect("confirmed");
        let s = self.auth_status(&sid, false).await;
        assert_eq!(s.status, AuthStatus::Authenticated, "{s:?}");
        bot
    }
}
