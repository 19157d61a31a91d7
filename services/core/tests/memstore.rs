//! The in-memory store where the conformance suites are silent: each case here was run the
//! same way against SQLite (a differential script over ~80 edge cases) and states what SQLite
//! answered, so the memory store keeps answering it.

use serde_json::json;
use switchyard_core::MemoryStore;
use switchyard_core::error::ErrorKind;
use switchyard_core::hoststore::{
    AgentRecord, EnrollmentRecord, HostRecord, HostStatus, HostStore,
};
use switchyard_core::model::*;
use switchyard_core::store::Store;
use switchyard_protocol::ConnectionStatus;

/// A migrated store with tenant `ten_a`, its connector `c1` and channel `ch1`.
async fn with_channel() -> MemoryStore {
    let s = MemoryStore::new();
    s.migrate().await.unwrap();
    s.create_tenant(&Tenant {
        id: "ten_a".into(),
        name: "a".into(),
        created_at: 1,
    })
    .await
    .unwrap();
    s.insert_connector(&ConnectorRecord {
        id: "c1".into(),
        tenant_id: "ten_a".into(),
        card_id: "card".into(),
        created_at: 1,
        offline_since: None,
    })
    .await
    .unwrap();
    s.insert_channel(&ChannelRecord {
        id: "ch1".into(),
        tenant_id: "ten_a".into(),
        connector_id: "c1".into(),
        card_id: "card".into(),
        route_socket: Some("sock".into()),
        profiles: vec![],
        status: ConnectionStatus::Created,
        view: json!({}),
        binding: None,
        binding_key: None,
        created_at: 1,
        updated_at: 1,
    })
    .await
    .unwrap();
    s
}

/// `route_states` answers once per existing channel, however often `ids` names it (the SQL
/// stores select `WHERE id IN (...)`).
#[tokio::test]
async fn route_states_names_a_repeated_channel_once() {
    let s = with_channel().await;
    let ids = ["ch1".to_owned(), "ch1".to_owned(), "missing".to_owned()];
    let states = s.route_states(&ids, 10).await.unwrap();
    assert_eq!(
        states,
        [RouteState {
            channel_id: "ch1".into(),
            route_socket: Some("sock".into()),
            max_pending_seq: None,
        }]
    );
}

/// Rows that hang off a channel need it, as the SQL foreign keys do.
#[tokio::test]
async fn rows_of_an_unknown_channel_are_not_found() {
    let s = with_channel().await;
    let file = FileRecord {
        file_ref: "f1".into(),
        tenant_id: "ten_a".into(),
        channel_id: "nope".into(),
        direction: FileDirection::Inbound,
        filename: "x".into(),
        mime_type: "text/plain".into(),
        file_type: "file".into(),
        byte_size: 5,
        storage_key: "k".into(),
        created_at: 1,
        expires_at: 2,
    };
    let claim = IdempotencyRecord {
        scope: "msg".into(),
        channel_id: "nope".into(),
        key: "k".into(),
        fingerprint: "f".into(),
        state: ClaimState::InProgress,
        outcome: None,
        created_at: 1,
        expires_at: 10,
    };
    let auth = AuthSessionRecord {
        id: "au".into(),
        channel_id: "nope".into(),
        flow_id: "f".into(),
        status: AuthStatus::Pending,
        state: None,
        public: json!({}),
        created_at: 1,
        expires_at: 2,
    };
    let kinds = [
        s.insert_file(&file).await.map_err(|e| e.kind),
        s.insert_file_within(&file, 10).await.map_err(|e| e.kind),
        s.claim(&claim).await.map(|_| ()).map_err(|e| e.kind),
        s.insert_auth_session(&auth).await.map_err(|e| e.kind),
    ];
    assert_eq!(kinds, [Err(ErrorKind::NotFound); 4]);
    // A file too large for the SQL column is refused before anything is stored.
    let huge = FileRecord {
        channel_id: "ch1".into(),
        byte_size: u64::MAX,
        ..file
    };
    assert_eq!(
        s.insert_file(&huge).await.map_err(|e| e.kind),
        Err(ErrorKind::Internal)
    );
    assert_eq!(s.get_file("f1").await.unwrap(), None);
}

/// A host's agents are replaced all or nothing: a list naming one agent twice is a conflict
/// and keeps the agents it would have replaced.
#[tokio::test]
async fn replacing_agents_is_all_or_nothing() {
    let s = with_channel().await;
    let host = HostRecord {
        id: "h1".into(),
        tenant_id: "ten_a".into(),
        name: "n".into(),
        status: HostStatus::Enrolling,
        cert_fingerprint: None,
        cert_pem: None,
        pairing_code: "p".into(),
        hostname: None,
        agent_version: None,
        adapters: vec![],
        pod_id: None,
        session_id: None,
        connected_at: None,
        last_seen_at: None,
        metrics: json!({}),
        config: json!({}),
        created_at: 1,
        revoked_at: None,
    };
    let token = EnrollmentRecord {
        token_hash: "t1".into(),
        host_id: "h1".into(),
        tenant_id: "ten_a".into(),
        created_at: 1,
        expires_at: 10,
        used_at: None,
    };
    s.insert_enrollment(&host, &token).await.unwrap();
    let agent = |id: &str| AgentRecord {
        // The store files the agent under the host it is replaced for.
        host_id: "elsewhere".into(),
        tenant_id: "ten_a".into(),
        agent_id: id.into(),
        runtime: "r".into(),
        model: "m".into(),
        tools: vec![],
        max_turns: 1,
        supports: vec![],
        updated_at: 1,
    };
    s.replace_agents("h1", &[agent("a")]).await.unwrap();
    let err = s
        .replace_agents("h1", &[agent("b"), agent("b")])
        .await
        .expect_err("one agent twice");
    assert_eq!(err.kind, ErrorKind::Conflict);
    let kept = s.list_agents("h1").await.unwrap();
    assert_eq!(
        kept,
        [AgentRecord {
            host_id: "h1".into(),
            ..agent("a")
        }]
    );
    let err = s
        .replace_agents("nope", &[agent("a")])
        .await
        .expect_err("unknown host");
    assert_eq!(err.kind, ErrorKind::NotFound);
}
