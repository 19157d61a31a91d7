//! What the Discord tests share: the fake Discord with its default bot, users and channels,
//! fast settings, and a [`Pod`] that binds through the form flow. The in-memory services, the
//! cluster state, the log capture and the waits come from `switchyard_core::testkit`.

#![allow(dead_code)] // each test binary uses a different part of the harness

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use switchyard_core::provider::AuthStep;
use switchyard_fake_discord::FakeDiscord;
use switchyard_provider_discord::{DiscordConfig, DiscordProvider, FLOW_BINDING};

pub use switchyard_core::testkit::*;

pub const TOKEN: &str = "MTEwMDAwMDAwMDAwMDAwMDAwMQ.GhIjKl.discord-test-token_0123456789abcdef";
pub const BOT_ID: &str = "1100000000000000001";
pub const USER: &str = "1100000000000000100";
pub const OTHER_BOT: &str = "1100000000000000101";
pub const DM: &str = "1100000000000000200";
pub const GUILD: &str = "1100000000000000300";
pub const GUILD_CHANNEL: &str = "1100000000000000301";

/// Fast settings for tests.
pub fn config(api_base: &str) -> DiscordConfig {
    let mut c = DiscordConfig::new(build_info(), api_base);
    c.lease_ttl = Duration::from_millis(1500);
    c.lease_retry = Duration::from_millis(200);
    c.reconnect_backoff = Duration::from_millis(100);
    c.max_reconnect_backoff = Duration::from_millis(500);
    c.invalid_session_wait = Duration::from_millis(200);
    c.refresh_interval = Duration::from_millis(300);
    c.request_timeout = Duration::from_secs(3);
    c.transfer_timeout = Duration::from_secs(5);
    c.edit_interval = Duration::from_millis(200);
    c.send_budget = Duration::from_secs(10);
    c
}

/// A pod running the Discord provider; when `run` is true its Gateway supervisor runs.
pub struct Pod(ProviderPod<DiscordProvider>);

impl std::ops::Deref for Pod {
    type Target = ProviderPod<DiscordProvider>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl Pod {
    pub async fn start(cluster: Arc<Cluster>, name: &str, cfg: DiscordConfig, run: bool) -> Self {
        Self(
            ProviderPod::start(
                cluster,
                name,
                switchyard_provider_discord::PREFIX,
                |services| DiscordProvider::new(cfg, services),
                run,
            )
            .await,
        )
    }

    /// Binds `channel_id` through the form flow and stores the binding as the core would.
    pub async fn bind(&self, channel_id: &str, token: &str) -> AuthStep {
        self.0
            .bind(FLOW_BINDING, channel_id, json!({"bot_token": token}))
            .await
    }

    pub async fn auth(&self, channel_id: &str, token: &str) -> AuthStep {
        self.0
            .auth(FLOW_BINDING, channel_id, json!({"bot_token": token}))
            .await
    }
}

/// A fake Discord with the default bot, a user with a DM channel, another bot and a guild
/// channel; heartbeats every 300 ms so zombie detection runs in tests.
pub async fn fake() -> FakeDiscord {
    let dc = FakeDiscord::start().await;
    dc.add_bot(TOKEN, BOT_ID, "switchyard_test_bot");
    dc.add_bot(
        "MTEwMDAwMDAwMDAwMDAwMDEwMQ.AbCdEf.other-bot-token_0123456789abcdef",
        OTHER_BOT,
        "other_bot",
    );
    dc.add_user(USER, "Ada Lovelace");
    dc.add_dm_channel(DM, USER);
    dc.add_guild_channel(GUILD_CHANNEL, GUILD);
    dc.set_heartbeat_interval(Duration::from_millis(300));
    dc.set_create_limit(1000, Duration::from_secs(1));
    dc.set_global_limit(1000);
    dc
}

/// Binds the default bot on `pod` and waits until its Gateway session is ready.
pub async fn bind_live(pod: &Pod, dc: &FakeDiscord, channel_id: &str) {
    let step = pod.bind(channel_id, TOKEN).await;
    assert!(matches!(step, AuthStep::Authenticated { .. }), "{step:?}");
    pod.provider.refresh().await.expect("refresh");
    eventually(WAIT, "gateway session live", || async {
        (dc.gateway_stats(BOT_ID).live_sessions == 1).then_some(())
    })
    .await;
    // READY handled: the session state is kept.
    eventually(WAIT, "session state kept", || async {
        pod.cluster()
            .kv(&format!("gw:{}", bot_key()))
            .filter(|s| !s.is_empty())
    })
    .await;
}

/// The bot's lease and state key suffix (a hash of its id), as the provider names it.
pub fn bot_key() -> String {
    let h = switchyard_core::crypto::sha256_hex(format!("discord-bot:{BOT_ID}").as_bytes());
    h[..32].to_owned()
}

/// The messages stored for `channel_id`, in order.
pub fn stored(
    cluster: &Cluster,
    channel_id: &str,
) -> Vec<switchyard_core::provider::InboundMessage> {
    cluster
        .inbound()
        .into_iter()
        .filter(|(c, _)| c == channel_id)
        .map(|(_, m)| m)
        .collect()
}
