//! The provider conformance suite (`switchyard_core::provider_conformance_tests!`) against
//! the agent-host provider over the real host subsystem (`Hosts`) on core's in-memory store:
//! a host is enrolled and given its certificate as `switchyard host enroll` and the first
//! connection would, then a channel is paired with it through the provider's form flow.
//! A device channel has no inbound messages and starting a run needs a connected host, so
//! the idempotency and ingress cases say why they are skipped.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use switchyard_core::MemoryStore;
use switchyard_core::bus::LocalBus;
use switchyard_core::crypto::{Cipher, Secret, UrlSigner};
use switchyard_core::engine::{CommitLimits, EngineConfig, Hub, HubParts};
use switchyard_core::ephemeral::MemoryEphemeral;
use switchyard_core::files::LocalFileStore;
use switchyard_core::hosts::{Hosts, HostsConfig};
use switchyard_core::model::Tenant;
use switchyard_core::store::Store;
use switchyard_core::testkit::conformance::ProviderHarness;
use switchyard_core::testkit::{Cluster, ProviderPod, TENANT};
use switchyard_protocol::BuildInfo;
use switchyard_provider_agent_host::{
    AgentHostProvider, FIELD_HOST_NAME, FIELD_PAIRING_CODE, FLOW_PAIRING, PREFIX,
};

const HOST_NAME: &str = "build-box";

struct AgentHost {
    pod: ProviderPod<AgentHostProvider>,
    pairing_code: String,
    enrollment_token: String,
    _files: tempfile::TempDir,
}

#[async_trait]
impl ProviderHarness for AgentHost {
    type Provider = AgentHostProvider;

    async fn start() -> Self {
        let files = tempfile::tempdir().expect("files dir");
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        store
            .create_tenant(&Tenant {
                id: TENANT.to_owned(),
                name: "conformance".to_owned(),
                created_at: 0,
            })
            .await
            .expect("tenant");
        let hub = Arc::new(Hub::new(HubParts {
            store: store.clone(),
            bus: Arc::new(LocalBus::new()),
            ephemeral: Arc::new(MemoryEphemeral::new(10_000)),
            files: Arc::new(LocalFileStore::new(files.path()).expect("files")),
            cipher: Cipher::from_base64(&[Secret::new(Cipher::generate_key())]).expect("cipher"),
            signer: UrlSigner::new(vec![Secret::new("conformance-signing-secret-0123")])
                .expect("signer"),
            config: EngineConfig::default(),
            pod_id: "pod-a".into(),
            public_base_url: "http://127.0.0.1:1".into(),
            commit: CommitLimits::default(),
            quotas: Default::default(),
            journal: switchyard_core::journal::JournalConfig::off(),
            tracer: switchyard_core::trace::Tracer::disabled(),
        }));
        let hosts = Arc::new(Hosts::new(hub, HostsConfig::default()));
        // Enrolled and given its certificate, as the CLI and the first connection do.
        let enrollment = hosts.enroll(TENANT, HOST_NAME).await.expect("enroll");
        let host = hosts
            .redeem(&enrollment.token)
            .await
            .expect("redeem")
            .expect("a fresh token");
        store
            .set_host_certificate(
                &host.id,
                "sha256:conformance",
                "-----BEGIN CERTIFICATE-----",
            )
            .await
            .expect("certificate");
        let build = BuildInfo {
            version: "0".into(),
            git_tag: "t".into(),
            git_rev: "r".into(),
            build_time: "b".into(),
        };
        let pod = ProviderPod::start(
            Cluster::new(),
            "pod-a",
            PREFIX,
            |services| AgentHostProvider::new(build, true, hosts, Duration::from_secs(5), services),
            true,
        )
        .await;
        Self {
            pod,
            pairing_code: host.pairing_code,
            enrollment_token: enrollment.token,
            _files: files,
        }
    }

    fn pod(&self) -> &ProviderPod<AgentHostProvider> {
        &self.pod
    }

    fn card_schema_errors(card: &Value) -> Vec<String> {
        switchyard_xagent_sim::schemas::validate_card(card)
            .err()
            .unwrap_or_default()
    }

    async fn bind(&self, channel_id: &str) -> Vec<String> {
        let step = self
            .pod
            .bind(
                FLOW_PAIRING,
                channel_id,
                json!({FIELD_HOST_NAME: HOST_NAME, FIELD_PAIRING_CODE: self.pairing_code}),
            )
            .await;
        assert!(
            matches!(
                step,
                switchyard_core::provider::AuthStep::Authenticated { .. }
            ),
            "pairing with the enrolled host: {step:?}"
        );
        // The pairing code opens the host to a tenant's channel; the enrollment token would
        // let anyone take the host's identity. Neither may be shown.
        vec![self.pairing_code.clone(), self.enrollment_token.clone()]
    }
}

switchyard_core::provider_conformance_tests!(AgentHost);
