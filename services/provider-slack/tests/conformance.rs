//! The provider conformance suite (`switchyard_core::provider_conformance_tests!`) against
//! the fake Slack, over Socket Mode.

mod common;

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;
use common::*;
use serde_json::{Value, json};
use switchyard_core::testkit::conformance::ProviderHarness;
use switchyard_fake_slack::FakeSlack;
use switchyard_provider_slack::{SlackProvider, TOOL_SEND};

struct Slack {
    pod: Pod,
    fs: FakeSlack,
    /// The event id of each event number delivered so far.
    events: Mutex<HashMap<u32, String>>,
}

#[async_trait]
impl ProviderHarness for Slack {
    type Provider = SlackProvider;

    async fn start() -> Self {
        let fs = fake().await;
        let pod = Pod::start(Cluster::new(), "pod-a", config(&fs.api_base()), true).await;
        Self {
            pod,
            fs,
            events: Mutex::default(),
        }
    }

    fn pod(&self) -> &ProviderPod<SlackProvider> {
        &self.pod
    }

    fn card_schema_errors(card: &Value) -> Vec<String> {
        switchyard_xagent_sim::schemas::validate_card(card)
            .err()
            .unwrap_or_default()
    }

    /// The form binding, then a first direct message: a send needs a known conversation.
    async fn bind(&self, channel_id: &str) -> Vec<String> {
        self.pod.bind(channel_id, socket_fields()).await;
        self.pod.provider.refresh().await.expect("refresh");
        eventually(WAIT, "socket mode connection", || async {
            (self.fs.connections(APP) == 1).then_some(())
        })
        .await;
        let cluster = self.pod.cluster().clone();
        let before = cluster.inbound().len();
        self.fs.push_message(APP, dm("hello"));
        inbound_n(&cluster, before + 1).await;
        vec![BOT_TOKEN.to_owned(), APP_TOKEN.to_owned()]
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

    /// Slack delivers at least once: a repeat is the same event id again.
    async fn deliver_inbound(&self, _channel_id: &str, n: u32) -> Option<()> {
        let known = self.events.lock().unwrap().get(&n).cloned();
        match known {
            Some(event_id) => assert!(self.fs.repeat_event(APP, &event_id)),
            None => {
                let pushed = self.fs.push_message(APP, dm(&format!("event {n}")));
                self.events.lock().unwrap().insert(n, pushed.event_id);
            }
        }
        eventually(WAIT, "the event acknowledged", || async {
            (self.fs.pending_events(APP) == 0).then_some(())
        })
        .await;
        Some(())
    }
}

switchyard_core::provider_conformance_tests!(Slack);
