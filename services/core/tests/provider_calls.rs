//! The engine around a provider's calls, through a mounted Card on a hub over the memory
//! store: a QR flow canceled while the provider is still answering `auth.status` (a long poll
//! at the target) is not bound by the provider's late "authenticated", and the session stays
//! canceled (failed on the wire); the provider's own retries inside a tool call are journaled
//! as attempts of the call.

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Map, Value, json};
use switchyard_core::engine::{CardServices, Hub, HubParts, MountedCard};
use switchyard_core::memstore::MemoryStore;
use switchyard_core::model::{AuthStatus, ChannelRecord};
use switchyard_core::provider::{
    AuthPoll, AuthRequest, AuthStep, OutboundMessage, ProgressSink, Provider, ProviderError,
    ToolCall,
};
use switchyard_core::store::Store;
use switchyard_protocol::ConnectionStatus;
use switchyard_protocol::card::{AuthFlow, AuthFlowType, Card, CardTool};
use switchyard_protocol::descriptor::TargetView;
use switchyard_protocol::packet::{
    AuthCancelPayload, AuthStartPayload, AuthStatusPayload, HelloPayload,
};

use common::ProbeProvider;

/// The probe's Card with one QR flow whose poll answers "authenticated" after a while, as a
/// target does when the phone confirms during a long poll, and one tool whose call retries
/// once at the target (as the provider kit's retry loop reports it) before it succeeds.
struct SlowQr {
    card: Card,
}

const TOOL: &str = "probe_send";

impl SlowQr {
    fn new() -> Self {
        let mut card = ProbeProvider::new().card().clone();
        card.auth_flows = vec![AuthFlow {
            id: "qr".into(),
            target_type: "im".into(),
            flow_type: AuthFlowType::QrLogin,
            title: "Scan".into(),
            description: None,
            fields: vec![],
        }];
        card.tools = vec![CardTool {
            tool_id: TOOL.into(),
            profile: "xagent.im.v2".into(),
            title: "Send".into(),
            description: "Sends a probe.".into(),
            related_skill_ids: vec![],
            input_schema: json!({"type": "object"}),
            output_schema: json!({"type": "object"}),
        }];
        Self { card }
    }
}

struct NoProgress;

impl ProgressSink for NoProgress {
    fn progress(&self, _status: &str, _message: &str, _progress: Option<f64>) {}
}

/// A hub over `store` with its journal on, and the slow-QR Card mounted on it.
fn mounted(store: &Arc<dyn Store>, dir: &tempfile::TempDir) -> MountedCard {
    let hub = Arc::new(Hub::new(HubParts {
        pod_id: "pod-a".into(),
        journal: switchyard_core::journal::JournalConfig::default(),
        ..common::hub_parts(store, dir)
    }));
    MountedCard::mount(
        CardServices::new(hub, common::CARD_ID, "/probe"),
        Arc::new(SlowQr::new()),
    )
}

/// A tenant, a socket's hello and a channel opened on it.
async fn open_channel(card: &MountedCard, store: &Arc<dyn Store>) -> ChannelRecord {
    let (tenant, _) = switchyard_core::engine::create_tenant(store.as_ref(), "t")
        .await
        .unwrap();
    let hello = HelloPayload {
        connector_card_id: common::CARD_ID.into(),
        connector_id: None,
        protocol_version: Some("3.0".into()),
        supported_profiles: Some(vec!["xagent.im.v2".into()]),
    };
    let ok = card.hello(&tenant.id, "sock_a", &hello).await.unwrap();
    card.open_channel(&ok.ident, None).await.unwrap().0
}

#[async_trait]
impl Provider for SlowQr {
    fn card(&self) -> &Card {
        &self.card
    }

    fn skill(&self) -> Option<&str> {
        None
    }

    fn prefix(&self) -> &'static str {
        "/probe"
    }

    async fn auth_start(&self, _req: AuthRequest<'_>) -> Result<AuthStep, ProviderError> {
        Ok(AuthStep::Pending {
            status: AuthStatus::Pending,
            qr_code_text: Some("qr-1".into()),
            qr_code_image: None,
            message: "scan".into(),
            poll_interval_ms: 1000,
            expires_at: i64::MAX,
            state: json!({"qr": 1}),
        })
    }

    async fn auth_poll(&self, _poll: AuthPoll<'_>) -> Result<Option<AuthStep>, ProviderError> {
        tokio::time::sleep(Duration::from_millis(400)).await;
        Ok(Some(AuthStep::Authenticated {
            credentials: json!({"token": "late"}),
            view: TargetView::default(),
            binding_key: None,
        }))
    }

    async fn invoke_tool(&self, call: ToolCall<'_>) -> Result<Value, ProviderError> {
        assert_eq!(call.tool_id, TOOL);
        // The first try at the target failed transiently; the retry went through.
        switchyard_core::journal::note_attempt("transient");
        Ok(json!({"sent": true}))
    }

    async fn deliver(&self, _msg: OutboundMessage<'_>) -> Result<(), ProviderError> {
        Ok(())
    }
}

#[tokio::test]
async fn a_confirmation_after_cancel_binds_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let card = mounted(&store, &dir);
    let ch = open_channel(&card, &store).await;

    let started = card
        .auth_start(
            &ch,
            &AuthStartPayload {
                flow_id: "qr".into(),
                input: Map::new(),
            },
        )
        .await
        .unwrap();
    assert_eq!(started["status"], "pending");
    let session = started["auth_session_id"].as_str().unwrap().to_owned();

    // auth.status waits on the target; the user cancels meanwhile; then the target answers.
    let ch_now = store.get_channel(&ch.id).await.unwrap().unwrap();
    let poll = AuthStatusPayload {
        flow_id: Some("qr".into()),
        auth_session_id: Some(session.clone()),
        refresh: false,
    };
    let cancel = AuthCancelPayload {
        auth_session_id: Some(session.clone()),
    };
    let (status, canceled) = tokio::join!(card.auth_status(&ch_now, &poll), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        card.auth_cancel(&ch_now, &cancel).await
    });
    assert_eq!(canceled.unwrap()["status"], "canceled");
    let status = status.unwrap();
    assert_eq!(status["status"], "failed", "{status}");
    let after = store.get_channel(&ch.id).await.unwrap().unwrap();
    assert!(
        after.binding.is_none(),
        "a late confirmation bound the channel"
    );
    let rec = store.get_auth_session(&session).await.unwrap().unwrap();
    assert_eq!(rec.status, AuthStatus::Canceled);
    assert!(
        rec.state.is_none(),
        "a canceled session keeps no provider state"
    );
}

#[tokio::test]
async fn a_tool_calls_retries_at_the_target_are_journaled_as_its_attempts() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let card = mounted(&store, &dir);
    let ch = open_channel(&card, &store).await;
    let blob = card.hub().cipher().encrypt_json(
        &switchyard_core::crypto::rows::channel(&ch.id),
        &json!({"token": "t"}),
    );
    store
        .set_channel_binding(
            &ch.id,
            Some(&blob),
            None,
            ConnectionStatus::Connected,
            &json!({}),
            switchyard_core::ids::now_ms(),
        )
        .await
        .unwrap();
    let ch = store.get_channel(&ch.id).await.unwrap().unwrap();

    let out = card
        .invoke_tool(&ch, TOOL, &Map::new(), "call-1", &NoProgress)
        .await
        .unwrap();
    assert_eq!(out, json!({"sent": true}));

    // The journal's writer stores in batches: wait for both steps.
    let mut steps = Vec::new();
    for _ in 0..200 {
        steps = store.journal_for_message("call-1", 10).await.unwrap();
        if steps.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let got: Vec<(&str, &str)> = steps
        .iter()
        .map(|e| (e.step.as_str(), e.detail.as_str()))
        .collect();
    assert!(got.contains(&("attempt", "transient")), "{got:?}");
    assert!(got.iter().any(|(step, _)| *step == "tool_call"), "{got:?}");
    assert!(steps.iter().all(|e| e.channel_id == ch.id));
}
