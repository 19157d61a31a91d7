//! The provider conformance suite (`switchyard_core::provider_conformance_tests!`) against
//! the fake iLink server.

mod common;

use std::sync::Mutex;

use async_trait::async_trait;
use common::*;
use serde_json::{Value, json};
use switchyard_core::testkit::conformance::ProviderHarness;
use switchyard_fake_wechat::{ConfirmedBot, FakeWechat};
use switchyard_provider_wechat::{TOOL_SEND, WechatProvider};

struct Wechat {
    pod: Pod,
    fake: FakeWechat,
    bot: Mutex<Option<ConfirmedBot>>,
}

impl Wechat {
    fn bot(&self) -> ConfirmedBot {
        self.bot.lock().unwrap().clone().expect("logged in")
    }
}

#[async_trait]
impl ProviderHarness for Wechat {
    type Provider = WechatProvider;

    async fn start() -> Self {
        let fake = FakeWechat::start().await;
        let pod = Pod::start(Cluster::new(), "pod-a", config(&fake), true).await;
        Self {
            pod,
            fake,
            bot: Mutex::default(),
        }
    }

    fn pod(&self) -> &ProviderPod<WechatProvider> {
        &self.pod
    }

    fn card_schema_errors(card: &Value) -> Vec<String> {
        switchyard_xagent_sim::schemas::validate_card(card)
            .err()
            .unwrap_or_default()
    }

    /// QR login, then a first message from the user: WeChat sends only to a user who wrote.
    async fn bind(&self, channel_id: &str) -> Vec<String> {
        let bot = self.pod.login(&self.fake, channel_id).await;
        let cluster = self.pod.cluster().clone();
        let before = cluster.inbound().len();
        self.fake.push_text(&bot.token, "hello");
        inbound_n(&cluster, before + 1).await;
        eventually(WAIT, "reply token", || async {
            cluster
                .kv_keys()
                .iter()
                .any(|k| k.starts_with("peers:"))
                .then_some(())
        })
        .await;
        let token = bot.token.clone();
        *self.bot.lock().unwrap() = Some(bot);
        vec![token]
    }

    fn idempotent_call(&self, channel_id: &str) -> Option<(String, Value)> {
        Some((
            TOOL_SEND.to_owned(),
            json!({"connector_channel_id": channel_id, "text": "once"}),
        ))
    }

    async fn target_sends(&self) -> usize {
        self.fake.sent(&self.bot().token).len()
    }

    /// A raw message with a fixed id: iLink repeats a message under a new `seq`.
    async fn deliver_inbound(&self, _channel_id: &str, n: u32) -> Option<()> {
        let bot = self.bot();
        self.fake.push_raw(
            &bot.token,
            json!({
                "message_id": 700_000 + n,
                "from_user_id": bot.user_id,
                "to_user_id": bot.bot_id,
                "client_id": "",
                "create_time_ms": switchyard_core::ids::now_ms(),
                "session_id": "",
                "group_id": "",
                "message_type": 1,
                "message_state": 2,
                "item_list": [{"type": 1, "text_item": {"text": format!("event {n}")}}],
                "context_token": format!("AARzJWAFAAABAAAAAAD{n:016}"),
            }),
        );
        Some(())
    }
}

switchyard_core::provider_conformance_tests!(Wechat);
