//! A QR flow canceled while the provider is still answering `auth.status` (a long poll at the
//! target): the provider's late "authenticated" must not bind the channel, and the session
//! stays canceled (failed on the wire). The engine's own path: `auth.start`, `auth.status`
//! and `auth.cancel` of a mounted Card on a hub over the memory store.

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Map, Value, json};
use switchyard_core::bus::LocalBus;
use switchyard_core::crypto::{Cipher, Secret, UrlSigner};
use switchyard_core::engine::{
    CardServices, CommitLimits, EngineConfig, Hub, HubParts, MountedCard,
};
use switchyard_core::ephemeral::MemoryEphemeral;
use switchyard_core::files::LocalFileStore;
use switchyard_core::memstore::MemoryStore;
use switchyard_core::model::AuthStatus;
use switchyard_core::provider::{
    AuthPoll, AuthRequest, AuthStep, OutboundMessage, Provider, ProviderError, ToolCall,
};
use switchyard_core::store::Store;
use switchyard_protocol::card::{AuthFlow, AuthFlowType, Card};
use switchyard_protocol::descriptor::TargetView;
use switchyard_protocol::packet::{
    AuthCancelPayload, AuthStartPayload, AuthStatusPayload, HelloPayload,
};

use common::ProbeProvider;

/// The probe's Card with one QR flow whose poll answers "authenticated" after a while, as a
/// target does when the phone confirms during a long poll.
struct SlowQr {
    card: Card,
}

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
        Self { card }
    }
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

    async fn invoke_tool(&self, _call: ToolCall<'_>) -> Result<Value, ProviderError> {
        Err(ProviderError::invalid("no tools"))
    }

    async fn deliver(&self, _msg: OutboundMessage<'_>) -> Result<(), ProviderError> {
        Ok(())
    }
}

#[tokio::test]
async fn a_confirmation_after_cancel_binds_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let hub = Arc::new(Hub::new(HubParts {
        store: store.clone(),
        bus: Arc::new(LocalBus::new()),
        ephemeral: Arc::new(MemoryEphemeral::new(1000)),
        files: Arc::new(LocalFileStore::new(dir.path()).unwrap()),
        cipher: Cipher::from_base64(&[Secret::new(Cipher::generate_key())]).unwrap(),
        signer: UrlSigner::new(vec![Secret::new("test-signing-secret-0123456789")]).unwrap(),
        config: EngineConfig::default(),
        pod_id: "pod-a".into(),
        public_base_url: "http://127.0.0.1:1".into(),
        commit: CommitLimits::default(),
        quotas: Default::default(),
        journal: switchyard_core::journal::JournalConfig::off(),
        tracer: switchyard_core::trace::Tracer::disabled(),
    }));
    let card = MountedCard::mount(
        CardServices::new(hub, common::CARD_ID, "/probe"),
        Arc::new(SlowQr::new()),
    );
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
    let (ch, _) = card.open_channel(&ok.ident, None).await.unwrap();

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
