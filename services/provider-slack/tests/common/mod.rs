//! What the Slack tests share: the fake Slack with its default app and user, fast settings,
//! and a [`Pod`] that binds through the form flow. The in-memory services, the cluster state,
//! the log capture and the waits come from `switchyard_core::testkit`.

#![allow(dead_code)] // each test binary uses a different part of the harness

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use switchyard_core::provider::AuthStep;
use switchyard_fake_slack::{FakeSlack, NewApp};
use switchyard_provider_slack::{FLOW_APP_BINDING, SlackConfig, SlackProvider};

pub use switchyard_core::testkit::*;

pub const APP: &str = "A0TESTAPP1";
pub const TEAM: &str = "T0TEAM1";
pub const BOT_TOKEN: &str = "xoxb-1111-2222-SecretBotTokenValue";
pub const APP_TOKEN: &str = "xapp-1-A0TESTAPP1-3333-SecretAppTokenValue";
pub const SIGNING: &str = "8f742231b10e8888abcd99yyyzzz85a5";
pub const BOT_USER: &str = "U0BOT";
pub const USER: &str = "U0ADA";
pub const DM: &str = "D0ADA";
pub const CHANNEL: &str = "C0GENERAL";

/// Fast settings for tests.
pub fn config(api_base: &str) -> SlackConfig {
    let mut c = SlackConfig::new(build_info(), api_base);
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

/// A pod running the Slack provider, its ingress served on a real port and, when `run` is
/// true, its background loops (Socket Mode) started.
pub struct Pod(ProviderPod<SlackProvider>);

impl std::ops::Deref for Pod {
    type Target = ProviderPod<SlackProvider>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl Pod {
    pub async fn start(cluster: Arc<Cluster>, name: &str, cfg: SlackConfig, run: bool) -> Self {
        Self(
            ProviderPod::start(
                cluster,
                name,
                switchyard_provider_slack::PREFIX,
                |services| SlackProvider::new(cfg, services),
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

    /// The Events API URL of a channel on this pod.
    pub fn events_url(&self, channel_id: &str) -> String {
        format!("{}/slack/events/{channel_id}", self.url)
    }
}

/// A fake Slack with the default app (Socket Mode and a signing secret), a user and a channel.
pub async fn fake() -> FakeSlack {
    let fs = FakeSlack::start().await;
    fs.set_retry_delays(vec![
        Duration::from_millis(300),
        Duration::from_millis(600),
        Duration::from_millis(1200),
    ]);
    fs.add_app(NewApp {
        app_id: APP.into(),
        team_id: TEAM.into(),
        team_name: "Acme".into(),
        bot_token: BOT_TOKEN.into(),
        app_token: Some(APP_TOKEN.into()),
        signing_secret: SIGNING.into(),
        bot_name: "helper".into(),
        bot_user_id: BOT_USER.into(),
        bot_id: "B0BOT".into(),
    });
    fs.add_user(USER, "ada", "Ada Lovelace");
    fs.add_channel(CHANNEL);
    fs
}

pub fn socket_fields() -> Value {
    json!({"bot_token": BOT_TOKEN, "app_token": APP_TOKEN})
}

pub fn http_fields() -> Value {
    json!({"bot_token": BOT_TOKEN, "signing_secret": SIGNING})
}

/// A direct message from the default user.
pub fn dm(text: &str) -> switchyard_fake_slack::Inbound {
    switchyard_fake_slack::Inbound {
        channel: DM.into(),
        user: USER.into(),
        text: text.into(),
        ..Default::default()
    }
}
