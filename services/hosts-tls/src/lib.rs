//! Agent host identity (docs/agent-hosts.md, "Identity"): the deployment's host CA and the
//! client certificates it issues ([`pki`]), the certificate-bound bearer token ([`jwt`]), the
//! pod's mTLS listener ([`server`]) and the host agent's TLS client configuration
//! ([`client`]).
//!
//! All TLS runs on rustls with the ring provider, chosen explicitly per configuration: no
//! process-wide default provider is installed or needed.

pub mod client;
pub mod jwt;
pub mod pki;
pub mod server;

pub use pki::{HostCa, IssuedCert, PkiError};
pub use server::PeerCertificate;
