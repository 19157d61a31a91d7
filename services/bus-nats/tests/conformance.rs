//! The Bus conformance suite against a real NATS server at 127.0.0.1:4222 (override with
//! SWITCHYARD_TEST_NATS_URL). Each run uses its own subject prefix, so runs can share a server.

use std::sync::Arc;

use switchyard_bus_nats::NatsBus;
use switchyard_core::conformance;
use switchyard_core::ids::new_id;

fn nats_url() -> String {
    std::env::var("SWITCHYARD_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
}

#[tokio::test]
async fn nats_bus_conforms() {
    let url = nats_url();
    let bus = NatsBus::connect(&url, &new_id("test"))
        .await
        .unwrap_or_else(|e| panic!("connect to NATS at {url}: {e}"));
    conformance::bus::run_all(Arc::new(bus.clone())).await;
    bus.drain().await.expect("drain");
}

#[tokio::test]
async fn unreachable_server_is_unavailable() {
    // Port 1 on loopback: nothing listens there, so the connect is refused at once.
    let err = NatsBus::connect("nats://127.0.0.1:1", "test")
        .await
        .expect_err("no server");
    assert_eq!(err.kind, switchyard_core::ErrorKind::Unavailable, "{err}");
}

#[tokio::test]
async fn bad_prefix_is_refused() {
    let err = NatsBus::connect(&nats_url(), "has space")
        .await
        .expect_err("bad prefix");
    assert_eq!(err.kind, switchyard_core::ErrorKind::Internal, "{err}");
}
