//! Agent host identity (docs/agent-hosts.md, "Identity"): the deployment's host CA and the
//! client certificates it issues ([`pki`]), the certificate-bound bearer token ([`jwt`]), the
//! pod's mTLS listener ([`server`]), the accept loop every pod listener shares ([`listen`]:
//! connection cap, header timeout, drain) and the host agent's TLS client configuration
//! ([`client`]).
//!
//! All TLS runs on rustls with the ring provider, chosen explicitly per configuration: no
//! process-wide default provider is installed or needed.
//!
//! Two halves: the client half (CSR, client configuration, certificate helpers) is always
//! built; the server half (the mTLS listener and host JWTs) is the `server` feature, which
//! the pod turns on and the host agent (`switchyard-host`) leaves off, so it carries no
//! HTTP server dependencies.

pub mod client;
#[cfg(feature = "server")]
pub mod jwt;
#[cfg(feature = "server")]
pub mod listen;
pub mod pki;
#[cfg(feature = "server")]
pub mod server;
mod tls;

pub use pki::{HostCa, IssuedCert, PkiError};
#[cfg(feature = "server")]
pub use server::PeerCertificate;
