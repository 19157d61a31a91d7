//! The provider conformance suite (`switchyard_core::provider_conformance_tests!`) against
//! the fake Discord, over the Gateway. A repeated event is the same MESSAGE_CREATE
//! dispatched again, as a resume from an older sequence replays it.

mod common;

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;
use common::*;
use serde_json::{Value, json};
use switchyard_core::testkit::conformance::ProviderHarness;
use switchyard_fake_discord::FakeDiscord;
use switchyard_provider_discord::{DiscordProvider, TOOL_MESSAGE_SEND};

struct Discord {
    pod: Pod,
    dc: FakeDiscord,
    /// The Discord message id of each event number pushed so far.
    events: Mutex<HashMap<u32, String>>,
}

#[async_trait]
impl ProviderHarness for Discord {
    type Provider = DiscordProvider;

    async fn start() -> Self {
        let dc = fake().await;
        let pod = Pod::start(Cluster::new(), "pod-a", config(&dc.api_base()), true).await;
        Self {
            pod,
            dc,
            events: Mutex::default(),
        }
    }

    fn pod(&self) -> &ProviderPod<DiscordProvider> {
        &self.pod
    }

    fn card_schema_errors(card: &Value) -> Vec<String> {
        switchyard_xagent_sim::schemas::validate_card(card)
            .err()
            .unwrap_or_default()
    }

    async fn bind(&self, channel_id: &str) -> Vec<String> {
        bind_live(&self.pod, &self.dc, channel_id).await;
        let secret_part = TOKEN.rsplit('.').next().expect("a token").to_owned();
        vec![TOKEN.to_owned(), secret_part]
    }

    fn idempotent_call(&self, channel_id: &str) -> Option<(String, Value)> {
        Some((
            TOOL_MESSAGE_SEND.to_owned(),
            json!({"connector_channel_id": channel_id, "text": "once", "recipient_ref": DM}),
        ))
    }

    async fn target_sends(&self) -> usize {
        self.dc.all_sent().len()
    }

    async fn deliver_inbound(&self, _channel_id: &str, n: u32) -> Option<()> {
        let known = self.events.lock().unwrap().get(&n).cloned();
        match known {
            Some(id) => assert!(self.dc.redeliver(BOT_ID, &id).is_some(), "replayed"),
            None => {
                let p = self
                    .dc
                    .push_message(BOT_ID, DM, USER, &format!("event {n}"), false, &[]);
                assert!(p.seq.is_some(), "a live session took the event");
                self.events.lock().unwrap().insert(n, p.message_id);
            }
        }
        Some(())
    }
}

switchyard_core::provider_conformance_tests!(Discord);
