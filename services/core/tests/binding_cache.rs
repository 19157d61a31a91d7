//! The ingress binding cache across two pods (two hubs over one store and one bus): an
//! inbound message whose channel was read lately is taken without reading the channel
//! again, and an unbind on one pod stops ingress on the other as soon as the bus carries the
//! notice, well within the cache's trust bound.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use switchyard_core::bus::{Bus, LocalBus};
use switchyard_core::crypto::{Cipher, Secret, rows};
use switchyard_core::engine::{Hub, HubParts, MountedCard};
use switchyard_core::ids::now_ms;
use switchyard_core::memstore::MemoryStore;
use switchyard_core::model::ChannelRecord;
use switchyard_core::provider::{InboundMessage, InboundOutcome, ProviderServices, ServicesError};
use switchyard_core::store::Store;
use switchyard_protocol::ConnectionStatus;
use switchyard_protocol::packet::HelloPayload;

use common::ProbeProvider;

/// One pod: its own hub (committer, cache) over the shared store and bus.
fn pod(
    name: &str,
    store: &Arc<dyn Store>,
    bus: &Arc<dyn Bus>,
    key: &str,
    dir: &tempfile::TempDir,
) -> MountedCard {
    let hub = Arc::new(Hub::new(HubParts {
        bus: bus.clone(),
        cipher: Cipher::from_base64(&[Secret::new(key)]).unwrap(),
        pod_id: name.into(),
        ..common::hub_parts(store, dir)
    }));
    MountedCard::new(hub, Arc::new(ProbeProvider::new()))
}

fn msg(id: &str) -> InboundMessage {
    InboundMessage {
        message_id: id.into(),
        text: Some(format!("text {id}")),
        sender_id: None,
        sender_name: None,
        files: vec![],
    }
}

/// Writes a binding straight into the store, as a pod's auth step does, without telling
/// any cache (the caller announces it, or not).
async fn write_binding(conn: &MountedCard, ch: &ChannelRecord, bound: bool) {
    let blob = bound.then(|| {
        conn.hub()
            .cipher()
            .encrypt_json(&rows::channel(&ch.id), &json!({"token": "t"}))
    });
    let status = if bound {
        ConnectionStatus::Connected
    } else {
        ConnectionStatus::Created
    };
    conn.hub()
        .store()
        .set_channel_binding(&ch.id, blob.as_deref(), None, status, &json!({}), now_ms())
        .await
        .unwrap();
}

#[tokio::test]
async fn ingress_reads_no_channel_once_cached_and_an_unbind_elsewhere_stops_it() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    store.migrate().await.unwrap();
    let bus: Arc<dyn Bus> = Arc::new(LocalBus::new());
    let key = Cipher::generate_key();
    let a = pod("pod-a", &store, &bus, &key, &dir);
    let b = pod("pod-b", &store, &bus, &key, &dir);

    // A channel opened and bound on pod A.
    let (tenant, _) = switchyard_core::engine::create_tenant(store.as_ref(), "t")
        .await
        .unwrap();
    let hello = HelloPayload {
        connector_card_id: a.card_id().to_owned(),
        connector_id: None,
        protocol_version: Some("3.0".into()),
        supported_profiles: Some(vec!["xagent.im.v2".into()]),
    };
    let ok = a.hello(&tenant.id, "sock_a", &hello).await.unwrap();
    let (ch, _) = a.open_channel(&ok.ident, None).await.unwrap();
    write_binding(&a, &ch, true).await;
    switchyard_core::bindings::announce(bus.as_ref(), std::slice::from_ref(&ch.id)).await;

    // Pod B's ingress: the provider reads the binding, then hands the message over.
    assert!(b.binding(&ch.id).await.unwrap().is_some());
    assert_eq!(
        b.accept_inbound(&ch.id, msg("m1")).await.unwrap(),
        InboundOutcome::Stored
    );

    // The channel changes in the store behind the cache's back (no notice): pod B still
    // takes the next messages, so neither its binding lookup nor its ingress read the
    // channel; the only store work left is the batch insert.
    write_binding(&a, &ch, false).await;
    assert!(b.binding(&ch.id).await.unwrap().is_some());
    assert_eq!(
        b.accept_inbound(&ch.id, msg("m2")).await.unwrap(),
        InboundOutcome::Stored
    );
    write_binding(&a, &ch, true).await;
    assert!(
        a.binding(&ch.id).await.unwrap().is_some(),
        "pod A caches it too"
    );

    // Now a real unbind on pod A (auth.logout): pod B refuses ingress as soon as the bus
    // carried the notice, far inside the cache's 30 s trust bound.
    let fresh = store.get_channel(&ch.id).await.unwrap().unwrap();
    let logged_out = Instant::now();
    a.auth_logout(&fresh).await.unwrap();
    loop {
        match b.accept_inbound(&ch.id, msg("m3")).await {
            Err(ServicesError::UnknownChannel) => break,
            Ok(_) => {}
            Err(e) => panic!("unexpected refusal: {e}"),
        }
        assert!(
            logged_out.elapsed() < Duration::from_secs(1),
            "pod B still takes inbound for an unbound channel 1 s after the unbind"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(b.binding(&ch.id).await.unwrap().is_none());
    // Pod A, which wrote the unbind, refuses at once.
    assert!(matches!(
        a.accept_inbound(&ch.id, msg("m4")).await,
        Err(ServicesError::UnknownChannel)
    ));
}
