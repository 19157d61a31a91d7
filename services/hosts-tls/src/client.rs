//! The host agent's side of the mTLS connection.

use std::sync::Arc;

use rustls::ClientConfig;

use crate::pki::PkiError;
use crate::tls::{parse_certs, parse_key, provider};

/// rustls client configuration that trusts only `ca_pem` (the host CA received at enrollment)
/// and presents `cert_pem` + `key_pem` when both are given (none before enrollment). Uses the
/// ring provider. For the host agent's WSS (tokio-tungstenite `Connector::Rustls`), its HTTPS
/// fallback and tests.
pub fn client_config(
    ca_pem: &str,
    cert_pem: Option<&str>,
    key_pem: Option<&str>,
) -> Result<Arc<ClientConfig>, PkiError> {
    let mut roots = rustls::RootCertStore::empty();
    for ca in parse_certs(ca_pem, "CA certificate")? {
        roots.add(ca)?;
    }
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let mut config = match (cert_pem, key_pem) {
        (Some(cert), Some(key)) => builder.with_client_auth_cert(
            parse_certs(cert, "client certificate")?,
            parse_key(key, "client private key")?,
        )?,
        (None, None) => builder.with_no_client_auth(),
        _ => {
            return Err(PkiError::InvalidInput(
                "a client certificate needs its key, and a key its certificate",
            ));
        }
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
