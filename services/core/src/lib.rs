//! Switchyard's core: domain records, the state machines of connectors, channels, auth
//! sessions and deliveries, and the seams (`Store`, `Bus`, `Ephemeral`, `FileStore`,
//! `Provider`) with their cheap in-process implementations.
//!
//! Core depends on `axum` on purpose, for two things only: a provider's ingress is an
//! `axum::Router` that the edge nests under the provider's prefix (`Provider::ingress`), and
//! a refused HTTP request is rendered once, by [`client_error::ClientError`]. No listener,
//! server or transport lives here; those are the edge's.

pub mod admission;
pub mod bindings;
pub mod bounded_body;
pub mod bus;
pub mod client_error;
pub mod crypto;
pub mod engine;
pub mod ephemeral;
pub mod error;
pub mod files;
pub mod hosts;
pub mod hoststore;
pub mod ids;
pub mod journal;
pub mod limits;
pub mod memstore;
pub mod model;
pub mod netguard;
pub mod provider;
pub mod quota;
pub mod settings;
pub mod store;
pub mod tally;
pub mod trace;

#[cfg(any(test, feature = "conformance"))]
pub mod conformance;
#[cfg(feature = "testkit")]
pub mod testkit;

pub use bus::{Bus, Doorbell, LocalBus};
pub use ephemeral::{Ephemeral, MemoryEphemeral};
pub use error::{BackendError, BackendResult, ErrorKind};
pub use files::{ByteStream, FileStore, LocalFileStore};
pub use hoststore::HostStore;
pub use memstore::MemoryStore;
pub use provider::{Provider, ProviderServices};
pub use store::Store;
