//! The Store's statements both dialects run as they are, one function per `Store` method over
//! the backend's [`Handles`](crate::Handles).

pub(crate) mod channels;
mod connectors;
mod console;
mod files;
mod journal;
mod outbox;
mod tenants;

pub use channels::*;
pub use connectors::*;
pub use console::*;
pub use files::*;
pub use journal::*;
pub use outbox::*;
pub use tenants::*;
