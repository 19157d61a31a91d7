//! What core's integration tests share: a probe provider, so the engine's tests mount a Card
//! without depending on a provider crate (which depends on core), and a hub's parts.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;
use switchyard_core::bus::LocalBus;
use switchyard_core::crypto::{Cipher, Secret, UrlSigner};
use switchyard_core::engine::{CommitLimits, EngineConfig, HubParts};
use switchyard_core::ephemeral::MemoryEphemeral;
use switchyard_core::files::LocalFileStore;
use switchyard_core::journal::JournalConfig;
use switchyard_core::provider::{
    AuthRequest, AuthStep, OutboundMessage, Provider, ProviderError, ToolCall,
};
use switchyard_core::store::Store;
use switchyard_core::trace::Tracer;
use switchyard_protocol::card::{
    BuildInfo, Card, ConnectorInfo, Security, Supports, TargetDecl, skill_name,
};
use switchyard_protocol::profile::{IM_V1, IM_V2};
use switchyard_protocol::{CARD_SCHEMA, PROTOCOL_VERSION};

/// A hub's parts over `store` for a test: an in-process bus and ephemeral state, files under
/// `dir`, fresh keys, pod `pod-test`, the journal and trace export off. A test changes what it
/// needs with `HubParts { .., ..hub_parts(..) }`.
pub fn hub_parts(store: &Arc<dyn Store>, dir: &tempfile::TempDir) -> HubParts {
    HubParts {
        store: store.clone(),
        bus: Arc::new(LocalBus::new()),
        ephemeral: Arc::new(MemoryEphemeral::new(10_000)),
        files: Arc::new(LocalFileStore::new(dir.path()).unwrap()),
        cipher: Cipher::from_base64(&[Secret::new(Cipher::generate_key())]).unwrap(),
        signer: UrlSigner::new(vec![Secret::new("test-signing-secret-0123456789")]).unwrap(),
        config: EngineConfig::default(),
        pod_id: "pod-test".into(),
        public_base_url: "http://127.0.0.1:1".into(),
        commit: CommitLimits::default(),
        quotas: Default::default(),
        journal: JournalConfig::off(),
        tracer: Tracer::disabled(),
    }
}

/// The probe's Card id.
pub const CARD_ID: &str = "im.probe";

/// A final message with this text makes the probe's delivery panic, as a provider's bug
/// would.
pub const PANIC_TEXT: &str = "probe: panic in deliver";

/// A provider with a Card that offers both IM profiles and nothing else: no tools, no auth
/// flow (starting one fails), and final messages are taken without a target. Enough for the
/// engine's rules that do not reach a target system (hello, channels, the outbox, delivery to
/// xAgent, provider state and secrets). A message reading [`PANIC_TEXT`] panics.
pub struct ProbeProvider {
    card: Card,
    skill: String,
}

impl ProbeProvider {
    pub fn new() -> Self {
        let build = BuildInfo {
            version: "0".into(),
            git_tag: "t".into(),
            git_rev: "r".into(),
            build_time: "b".into(),
        };
        let card = Card {
            schema: CARD_SCHEMA.into(),
            protocol_version: PROTOCOL_VERSION.into(),
            build,
            connector_card_id: CARD_ID.into(),
            connector: ConnectorInfo {
                name: "Probe".into(),
                version: "0.0.0".into(),
                vendor: "Switchyard tests".into(),
                description: "A Card without a target system, for core's tests.".into(),
            },
            supports: Supports {
                user_channel_mode: "multiple".into(),
                target_types: vec!["im".into()],
                targets: vec![TargetDecl {
                    target_type: "im".into(),
                    provider: "probe".into(),
                    label: "Probe".into(),
                }],
                profiles: vec![IM_V2.into(), IM_V1.into()],
            },
            tools: vec![],
            auth_flows: vec![],
            ui: None,
            security: Security {
                trust_level: "first_party".into(),
                api_key_required: true,
                data_classes: vec!["message".into()],
            },
        };
        let skill = format!("---\nname: {}\n---\nA probe.\n", skill_name(CARD_ID));
        Self { card, skill }
    }
}

#[async_trait]
impl Provider for ProbeProvider {
    fn card(&self) -> &Card {
        &self.card
    }

    fn skill(&self) -> Option<&str> {
        Some(&self.skill)
    }

    fn prefix(&self) -> &'static str {
        "/probe"
    }

    async fn auth_start(&self, _req: AuthRequest<'_>) -> Result<AuthStep, ProviderError> {
        Err(ProviderError::invalid("the probe has no auth flow"))
    }

    async fn invoke_tool(&self, _call: ToolCall<'_>) -> Result<Value, ProviderError> {
        Err(ProviderError::invalid("the probe has no tools"))
    }

    async fn deliver(&self, msg: OutboundMessage<'_>) -> Result<(), ProviderError> {
        assert_ne!(msg.text, Some(PANIC_TEXT), "the probe panics as asked");
        Ok(())
    }
}
