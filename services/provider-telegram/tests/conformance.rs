//! The provider conformance suite (`switchyard_core::provider_conformance_tests!`) against
//! the fake Bot API, in webhook mode so that a repeated update is a repeated post.

mod common;

use async_trait::async_trait;
use common::*;
use serde_json::{Value, json};
use switchyard_core::testkit::conformance::ProviderHarness;
use switchyard_fake_telegram::FakeTelegram;
use switchyard_provider_telegram::{Mode, TOOL_MESSAGE_SEND, TelegramProvider};

struct Telegram {
    pod: Pod,
    tg: FakeTelegram,
}

#[async_trait]
impl ProviderHarness for Telegram {
    type Provider = TelegramProvider;

    async fn start() -> Self {
        let tg = fake().await;
        let cfg = config(&tg.base_url(), Mode::Webhook);
        let pod = Pod::start(Cluster::new(), "pod-a", cfg, true).await;
        Self { pod, tg }
    }

    fn pod(&self) -> &ProviderPod<TelegramProvider> {
        &self.pod
    }

    fn card_schema_errors(card: &Value) -> Vec<String> {
        switchyard_xagent_sim::schemas::validate_card(card)
            .err()
            .unwrap_or_default()
    }

    async fn bind(&self, channel_id: &str) -> Vec<String> {
        self.pod.bind(channel_id, TOKEN, json!(CHAT)).await;
        let (_, secret_part) = TOKEN.split_once(':').expect("a bot token");
        vec![TOKEN.to_owned(), secret_part.to_owned()]
    }

    fn idempotent_call(&self, channel_id: &str) -> Option<(String, Value)> {
        Some((
            TOOL_MESSAGE_SEND.to_owned(),
            json!({"connector_channel_id": channel_id, "text": "once"}),
        ))
    }

    async fn target_sends(&self) -> usize {
        self.tg.all_sent().len()
    }

    async fn deliver_inbound(&self, _channel_id: &str, n: u32) -> Option<()> {
        let secret = eventually(WAIT, "webhook registered", || async {
            self.tg.webhook(TOKEN).secret_token
        })
        .await;
        let update = json!({"update_id": n, "message": {"message_id": 9000 + n, "date": 1,
            "chat": {"id": CHAT, "type": "private"}, "text": format!("event {n}")}});
        let url = format!(
            "{}/telegram{}",
            self.pod.url,
            TelegramProvider::webhook_path(BOT_ID)
        );
        let r = reqwest::Client::new()
            .post(url)
            .header("X-Telegram-Bot-Api-Secret-Token", &secret)
            .json(&update)
            .send()
            .await
            .expect("webhook post");
        assert_eq!(r.status(), 200, "the update was taken");
        Some(())
    }
}

switchyard_core::provider_conformance_tests!(Telegram);
