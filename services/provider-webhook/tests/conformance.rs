//! The provider conformance suite (`switchyard_core::provider_conformance_tests!`) against
//! the fake chat system.

mod common;

use async_trait::async_trait;
use common::*;
use serde_json::{Value, json};
use switchyard_core::testkit::conformance::ProviderHarness;
use switchyard_fake_webhook::{FakeWebhook, InboundRequest};
use switchyard_provider_webhook::{FLOW_BINDING, PREFIX, TOOL_MESSAGE_SEND, WebhookProvider};

/// The secret of the endpoint URL's query (the chat system's own token).
const PATH_SECRET: &str = "path-secret-token";

struct Webhook {
    pod: ProviderPod<WebhookProvider>,
    ep: FakeWebhook,
}

#[async_trait]
impl ProviderHarness for Webhook {
    type Provider = WebhookProvider;

    async fn start() -> Self {
        let ep = endpoint().await;
        let pod = ProviderPod::start(
            Cluster::new(),
            "pod-a",
            PREFIX,
            |services| WebhookProvider::new(config(), services),
            true,
        )
        .await;
        Self { pod, ep }
    }

    fn pod(&self) -> &ProviderPod<WebhookProvider> {
        &self.pod
    }

    fn card_schema_errors(card: &Value) -> Vec<String> {
        switchyard_xagent_sim::schemas::validate_card(card)
            .err()
            .unwrap_or_default()
    }

    async fn bind(&self, channel_id: &str) -> Vec<String> {
        let input = json!({"endpoint_url": self.ep.url(), "signing_secret": SECRET});
        self.pod.bind(FLOW_BINDING, channel_id, input).await;
        assert!(self.ep.url().contains(PATH_SECRET));
        vec![SECRET.to_owned(), PATH_SECRET.to_owned()]
    }

    fn idempotent_call(&self, channel_id: &str) -> Option<(String, Value)> {
        Some((
            TOOL_MESSAGE_SEND.to_owned(),
            json!({"connector_channel_id": channel_id, "text": "once"}),
        ))
    }

    /// The chat system dedupes by message id: distinct ids are what it took.
    async fn target_sends(&self) -> usize {
        let mut ids: Vec<String> = self
            .ep
            .received()
            .iter()
            .filter_map(|r| serde_json::from_slice::<Value>(&r.raw).ok())
            .filter_map(|v| v["message_id"].as_str().map(str::to_owned))
            .collect();
        ids.sort();
        ids.dedup();
        ids.len()
    }

    async fn deliver_inbound(&self, channel_id: &str, n: u32) -> Option<()> {
        let body = json!({"message_id": format!("in_{n}"), "text": format!("event {n}")});
        let req = InboundRequest::raw(
            SECRET,
            "application/json",
            serde_json::to_vec(&body).unwrap(),
        );
        let url = format!("{}/webhook/inbound/{channel_id}", self.pod.url);
        let r = req
            .request(&reqwest::Client::new(), &url)
            .send()
            .await
            .expect("inbound post");
        assert_eq!(r.status(), 202, "the message was taken");
        Some(())
    }
}

switchyard_core::provider_conformance_tests!(Webhook);
