//! The trait conformance suites against the in-process implementations (the bus, the
//! ephemeral store, local files and the in-memory `Store`). Backend crates run the same
//! suites against NATS, Redis, S3, SQLite and Postgres.

use std::future::Future;
use std::sync::Arc;

use switchyard_core::conformance;
use switchyard_core::store::Store;
use switchyard_core::{LocalBus, LocalFileStore, MemoryEphemeral, MemoryStore};

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

/// Gives a store conformance case a fresh, empty in-memory store.
async fn in_memory<F>(case: impl FnOnce(Arc<dyn Store>) -> F)
where
    F: Future<Output = ()> + Send + 'static,
{
    case(Arc::new(MemoryStore::new())).await;
}

mod memory_store {
    use super::*;
    switchyard_core::store_conformance_tests!(in_memory);
}
