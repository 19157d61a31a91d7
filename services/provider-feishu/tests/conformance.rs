//! The provider conformance suite (`switchyard_core::provider_conformance_tests!`) against
//! the fake Open Platform, over the long connection.

mod common;

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;
use common::*;
use serde_json::{Value, json};
use switchyard_core::testkit::conformance::ProviderHarness;
use switchyard_fake_feishu::{Chat, FakeFeishu};
use switchyard_provider_feishu::{FeishuProvider, TOOL_SEND};

struct Feishu {
    pod: Pod,
    fs: FakeFeishu,
    /// The event id of each event number delivered so far.
    events: Mutex<HashMap<u32, String>>,
}

fn p2p() -> Chat {
    Chat::P2p {
        user_open_id: USER.into(),
    }
}

#[async_trait]
impl ProviderHarness for Feishu {
    type Provider = FeishuProvider;

    async fn start() -> Self {
        let fs = fake().await;
        let pod = Pod::start(Cluster::new(), "pod-a", config(&fs.base_url()), true).await;
        Self {
            pod,
            fs,
            events: Mutex::default(),
        }
    }

    fn pod(&self) -> &ProviderPod<FeishuProvider> {
        &self.pod
    }

    fn card_schema_errors(card: &Value) -> Vec<String> {
        switchyard_xagent_sim::schemas::validate_card(card)
            .err()
            .unwrap_or_default()
    }

    /// The form binding, then a first message from the user: a send needs a known chat.
    async fn bind(&self, channel_id: &str) -> Vec<String> {
        self.pod.bind(channel_id, app_fields()).await;
        self.pod.provider.refresh().await.expect("refresh");
        eventually(WAIT, "long connection", || async {
            (self.fs.connections(APP) == 1).then_some(())
        })
        .await;
        let cluster = self.pod.cluster().clone();
        let before = cluster.inbound().len();
        self.fs.push_text(APP, &p2p(), "hello");
        inbound_n(&cluster, before + 1).await;
        vec![SECRET.to_owned()]
    }

    fn idempotent_call(&self, channel_id: &str) -> Option<(String, Value)> {
        Some((
            TOOL_SEND.to_owned(),
            json!({"connector_channel_id": channel_id, "text": "once"}),
        ))
    }

    async fn target_sends(&self) -> usize {
        self.fs.all_sent().len()
    }

    /// Feishu delivers at least once: a repeat is the same event id again.
    async fn deliver_inbound(&self, _channel_id: &str, n: u32) -> Option<()> {
        let known = self.events.lock().unwrap().get(&n).cloned();
        match known {
            Some(event_id) => assert!(self.fs.repeat_event(APP, &event_id)),
            None => {
                let pushed = self.fs.push_text(APP, &p2p(), &format!("event {n}"));
                self.events.lock().unwrap().insert(n, pushed.event_id);
            }
        }
        eventually(WAIT, "the event acked", || async {
            (self.fs.pending_events(APP) == 0).then_some(())
        })
        .await;
        Some(())
    }
}

switchyard_core::provider_conformance_tests!(Feishu);
