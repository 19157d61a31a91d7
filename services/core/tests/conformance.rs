//! The trait conformance suites against the in-process implementations. Backend crates run
//! the same suites against NATS, Redis and S3.

use std::sync::Arc;

use switchyard_core::conformance;
use switchyard_core::{LocalBus, LocalFileStore, MemoryEphemeral};

#[tokio::test]
async fn local_bus_conforms() {
    conformance::bus::run_all(Arc::new(LocalBus::new())).await;
}

#[tokio::test]
async fn memory_ephemeral_conforms() {
    conformance::ephemeral::run_all(Arc::new(MemoryEphemeral::default())).await;
}

#[tokio::test]
async fn local_file_store_conforms() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = LocalFileStore::new(dir.path().join("files")).expect("local file store");
    conformance::files::run_all(Arc::new(store)).await;
}
